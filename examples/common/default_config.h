// The engine configuration the examples train the MLP with, and their
// --dtype flag.
#pragma once

#include <string>
#include <string_view>

#include "zest/config/config.h"

namespace examples {

// AdamW at `lr` with weight decay 0.01, gradient clipping at 1. Stage 3's
// persistence threshold is 0: the example's layers (65k parameters) are
// under DeepSpeed's default of 1e5, which would keep them all whole.
zest::EngineConfig default_engine_config(float lr);

// --dtype's value: fp32, bf16 or fp16, else a cli::UsageError naming it.
std::string dtype_flag(std::string_view flag, std::string_view text);
// bf16 or fp16 on for those names, neither for fp32.
void set_compute_dtype(zest::EngineConfig& config, std::string_view dtype);

}  // namespace examples
