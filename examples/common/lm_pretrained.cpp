#include "common/lm_pretrained.h"

#include <cctype>
#include <memory>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "zest/core/check.h"
#include "zest/hf/hf_export.h"

namespace examples {

zest::LoraOptions PretrainedOptions::lora() const {
  zest::LoraOptions l;
  l.r = lora_r;
  l.alpha = lora_alpha;
  return l;
}

cli::Option* add_pretrained_flags(cli::App& app, PretrainedOptions& o, std::string& shard_size) {
  app.add_option("--lora", o.lora_r)->check(cli::Range(int64_t{0}, int64_t{1} << 16));
  app.add_option_function(
         "--lora-alpha",
         [&o](const double& alpha) {
           o.lora_alpha = alpha;
           o.lora_alpha_given = true;
         },
         "the adapters' alpha (with --lora)")
      ->check(cli::real_range(1e-6, 1e6));
  cli::Option* hf = app.add_option("--hf", o.hf_dir);
  app.add_option("--export-hf", o.export_hf_dir);
  app.add_option("--max-shard-size", shard_size);
  app.add_option("--export-dtype", o.export_dtype)->check(cli::IsMember({"fp32", "bf16", "fp16"}));
  app.add_flag("--export-adapters", o.export_adapters);
  app.add_flag("--export-replace", o.export_replace);
  return hf;
}

void finish_pretrained_flags(PretrainedOptions& o, const std::string& shard_size) {
  if (!shard_size.empty()) o.max_shard_size = parse_byte_size(shard_size);
  if (o.export_adapters && o.lora_r == 0) cli::usage_error("--export-adapters needs --lora R: there are no adapters");
  if (o.lora_alpha_given && o.lora_r == 0) cli::usage_error("--lora-alpha needs --lora R: there are no adapters");
}

NamedOptions shared_run_options(const LmRunOptions& run, const PretrainedOptions& pretrained, const MeshFlags& mesh) {
  return {{"--offload", fmt::format("{}", run.offload)},
          {"--steps", fmt::format("{}", run.steps)},
          {"--batch", fmt::format("{}", run.batch)},
          {"--lr", fmt::format("{}", run.lr)},
          {"--seed", fmt::format("{}", run.seed)},
          {"--data", run.data},
          {"--eval-every", fmt::format("{}", run.eval_every)},
          {"--val-windows", fmt::format("{}", run.val_windows)},
          {"--save", run.save_dir},
          {"--save-total-limit", fmt::format("{}", run.save_total_limit)},
          {"--load", run.load_dir},
          {"--lora", fmt::format("{}", pretrained.lora_r)},
          {"--lora-alpha", fmt::format("{}", pretrained.lora_alpha)},
          {"--hf", pretrained.hf_dir},
          {"--export-hf", pretrained.export_hf_dir},
          {"--tp", fmt::format("{}", mesh.tp)},
          {"--pp", fmt::format("{}", mesh.pp)},
          {"--pipeline-schedule", fmt::format("{}", static_cast<int>(mesh.pipeline_schedule))}};
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

zest::HfImportReport load_pretrained(zest::TorchModule& zt, const std::string& dir) {
  zest::HfImportOptions import;
  import.allow_missing = zest::is_lora_adapter;
  const zest::HfImportReport r = zt.import_hf(dir, import);
  if (zt.engine().comm().rank() == 0) {
    fmt::print("loaded {}: {} tensors, {:.1f} MiB of {:.1f} MiB read by rank 0 in {:.2f} s\n", dir, r.tensors_loaded,
               static_cast<double>(r.bytes_read) / (1 << 20), static_cast<double>(r.tensor_bytes) / (1 << 20),
               r.seconds);
  }
  return r;
}

namespace {

zest::DType export_dtype(const PretrainedOptions& o, const std::string& checkpoint_dtype) {
  const std::string& d = !o.export_dtype.empty() ? o.export_dtype : checkpoint_dtype;
  if (d == "float32" || d == "fp32") return zest::DType::kFloat32;
  if (d == "float16" || d == "fp16") return zest::DType::kFloat16;
  return zest::DType::kBFloat16;
}

}  // namespace

void export_pretrained(zest::Engine& engine, const PretrainedOptions& o, const std::string& config_json,
                       const std::string& checkpoint_dtype, const std::vector<std::string>& lora_targets,
                       const std::vector<std::string>& run_inputs) {
  zest::HfExportOptions e;
  e.inputs = run_inputs;
  e.inputs.push_back(o.hf_dir);
  e.replace = o.export_replace;
  e.dtype = export_dtype(o, checkpoint_dtype);
  e.max_shard_size = static_cast<uint64_t>(o.max_shard_size);
  if (!config_json.empty()) {
    nlohmann::json j = nlohmann::json::parse(config_json);
    j["torch_dtype"] = e.dtype == zest::DType::kFloat32   ? "float32"
                       : e.dtype == zest::DType::kFloat16 ? "float16"
                                                          : "bfloat16";
    e.config_json = j.dump(2) + "\n";
  } else {
    e.config_from = o.hf_dir;
  }
  zest::HfExportReport r;
  if (o.lora_r > 0 && o.export_adapters) {
    r = zest::export_hf_lora_apart(engine, o.export_hf_dir, e, o.lora(), lora_targets, o.hf_dir);
  } else if (o.lora_r > 0) {
    r = zest::export_hf_lora_merged(engine, o.export_hf_dir, e, o.lora());
  } else {
    r = zest::export_hf(engine, o.export_hf_dir, e);
  }
  // The writer's report (world rank 0's; on a mesh the other dp rank 0s
  // have none) names the files.
  if (!r.files.empty()) {
    fmt::print("exported {}: {} files, {:.1f} MiB of tensors in {}{} in {:.2f} s\n", r.dir, r.files.size(),
               static_cast<double>(r.tensor_bytes) / (1 << 20), zest::dtype_name(e.dtype),
               o.lora_r == 0 ? "" : o.export_adapters ? ", adapters apart" : ", adapters merged", r.seconds);
  }
}

}  // namespace examples
