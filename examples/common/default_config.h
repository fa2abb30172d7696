// The engine configuration the examples train the MLP with, and their
// --dtype flag.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "zest/config/config.h"

namespace examples {

// AdamW at `lr` with weight decay 0.01, gradient clipping at 1. Stage 3's
// persistence threshold is 0: the example's layers (65k parameters) are
// under DeepSpeed's default of 1e5, which would keep them all whole.
zest::EngineConfig default_engine_config(float lr);

// Stage 3's prefetch window and reuse distance for a model of this hidden
// size, where no configuration file sets them: 0.9 x hidden^2 elements each,
// the value Hugging Face's Trainer fills "auto" with for the prefetch
// bucket. DeepSpeed's defaults (5e7 and 1e9 elements) are the whole of an
// example-sized model: every unit would be gathered at once beside the
// shards and kept gathered from its forward to its backward (Note [stage-3
// reuse distance]), so stage 3 would peak above stage 2 and hold more than
// the memory estimate's model states. Within one window only the units used
// again that soon stay gathered (those at the turn from forward to backward).
void set_stage3_windows(zest::EngineConfig& config, int64_t hidden_size);

// --dtype's value: fp32, bf16 or fp16, else a cli::UsageError naming it.
std::string dtype_flag(std::string_view flag, std::string_view text);
// bf16 or fp16 on for those names, neither for fp32.
void set_compute_dtype(zest::EngineConfig& config, std::string_view dtype);

}  // namespace examples
