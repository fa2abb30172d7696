#include "options.h"

#include <cctype>

#include <fmt/format.h>

#include "common/default_config.h"

namespace llama {

std::string usage() {
  return "usage: llama [--ranks N | --launch] [--stage S] [--dtype fp32|bf16] [--offload]\n"
         "             [--config config.json] [--steps N] [--batch ROWS] [--context N] [--lr X] [--seed N]\n"
         "             [--threads N] [--tied] [--lora R] [--lora-alpha A]\n"
         "             [--data FORTUNE_FILE_OR_DIR] [--eval-every N] [--val-windows N] [--print-every N]\n"
         "             [--save CKPT_ROOT] [--load CKPT_ROOT]\n"
         "             [--hf HF_DIR] [--export-hf DIR] [--max-shard-size BYTES] [--recompute]\n"
         "Without --config or --hf: 4 layers, hidden 128, 4 heads (2 kv), intermediate 352, vocab 256.\n";
}

int64_t parse_byte_size(const std::string& text) {
  size_t digits = 0;
  while (digits < text.size() && std::isdigit(static_cast<unsigned char>(text[digits])) != 0) ++digits;
  const std::string unit = text.substr(digits);
  const std::pair<const char*, int64_t> units[] = {{"", 1},           {"B", 1},
                                                   {"KB", 1000},      {"MB", 1000 * 1000},
                                                   {"GB", 1000 * 1000 * 1000}, {"KiB", 1024},
                                                   {"MiB", 1024 * 1024}, {"GiB", 1024 * 1024 * 1024}};
  for (const auto& [name, scale] : units) {
    if (unit != name || digits == 0) continue;
    const int64_t n = cli::number<int64_t>("--max-shard-size", std::string_view(text).substr(0, digits), 1,
                                           (int64_t{1} << 50) / scale);
    return n * scale;
  }
  cli::usage_error("--max-shard-size '{}': expected bytes, optionally with KB, MB, GB, KiB, MiB or GiB", text);
}

Options parse_options(int argc, char** argv) {
  Options o;
  CLI::App app("llama");
  bool tied = false;
  std::string shard_size;
  examples::add_lm_run_flags(app, o);
  app.add_flag("--tied", tied);
  app.add_flag("--recompute", o.recompute);
  app.add_option("--stage", o.stage)->check(CLI::Range(0, 3));
  app.add_option("--dtype", o.dtype)->check(CLI::IsMember({"fp32", "bf16"}));
  app.add_option("--config", o.config_path);
  app.add_option("--context", o.context)->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--lora", o.lora_r)->check(CLI::Range(int64_t{0}, int64_t{1} << 16));
  app.add_option("--lora-alpha", o.lora_alpha)->check(cli::real_range(1e-6, 1e6));
  CLI::Option* hf = app.add_option("--hf", o.hf_dir);
  app.add_option("--export-hf", o.export_hf_dir);
  app.add_option("--max-shard-size", shard_size);
  app.get_option("--config")->excludes(hf);
  cli::parse(app, argc, argv);
  if (!shard_size.empty()) o.max_shard_size = parse_byte_size(shard_size);
  if (!o.config_path.empty()) {
    try {
      o.model = Config::from_json_file(o.config_path);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("--config: {}", e.what()));
    }
  }
  if (tied) o.model.tie_word_embeddings = true;
  if (o.context > o.model.max_position_embeddings) {
    cli::usage_error("--context {} is longer than the model's max_position_embeddings {}", o.context,
                     o.model.max_position_embeddings);
  }
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int world) {
  zest::EngineConfig c = examples::default_engine_config(opt.lr);
  c.zero.stage = opt.stage;
  examples::set_compute_dtype(c, opt.dtype);
  if (opt.offload) {
    if (opt.stage == 0) throw UsageError("--offload needs --stage 1, 2 or 3: stage 0 shards no optimizer state to offload");
    c.offload_optimizer.device = zest::OffloadDevice::kCpu;
  }
  if (opt.batch % world != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} ranks", opt.batch, world));
  }
  return c;
}

}  // namespace llama
