#include "common/default_config.h"

#include "cli/cli.h"

namespace examples {

zest::EngineConfig default_engine_config(float lr) {
  zest::EngineConfig c;
  c.optimizer.kind = zest::OptimizerKind::kAdamW;
  c.optimizer.lr = lr;
  c.optimizer.weight_decay = 0.01f;
  c.gradient_clipping = 1.0;
  c.zero.stage3_param_persistence_threshold = 0;
  return c;
}

void set_stage3_windows(zest::EngineConfig& config, int64_t hidden_size) {
  const auto d = static_cast<double>(hidden_size);
  config.zero.stage3_prefetch_bucket_size = static_cast<int64_t>(0.9 * d * d);
  config.zero.stage3_max_reuse_distance = static_cast<int64_t>(0.9 * d * d);
}

std::string dtype_flag(std::string_view flag, std::string_view text) {
  if (text != "fp32" && text != "bf16" && text != "fp16") {
    cli::usage_error("{} '{}': expected fp32, bf16 or fp16", flag, text);
  }
  return std::string(text);
}

void set_compute_dtype(zest::EngineConfig& config, std::string_view dtype) {
  config.bf16 = dtype == "bf16";
  config.fp16.enabled = dtype == "fp16";
}

}  // namespace examples
