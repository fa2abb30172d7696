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
         "             [--hf HF_DIR] [--export-hf DIR] [--max-shard-size BYTES] [--export-dtype fp32|bf16|fp16]\n"
         "             [--export-adapters] [--recompute] [--timeout SECONDS]\n"
         "Without --config or --hf: 4 layers, hidden 128, 4 heads (2 kv), intermediate 352, vocab 256.\n";
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
  CLI::Option* hf = examples::add_pretrained_flags(app, o, shard_size);
  app.get_option("--config")->excludes(hf);
  cli::parse(app, argc, argv);
  examples::finish_pretrained_flags(o, shard_size);
  if (!o.config_path.empty() || !o.hf_dir.empty()) {
    const std::string path = !o.config_path.empty() ? o.config_path : o.hf_dir + "/config.json";
    try {
      o.model = Config::from_json_file(path);
    } catch (const std::invalid_argument& e) {
      throw UsageError(fmt::format("{}: {}", !o.config_path.empty() ? "--config" : "--hf", e.what()));
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
