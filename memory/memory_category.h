// What an allocation is for. Every allocation carries one, so memory can be
// reported by category (the terms of the ZeRO memory model) rather than only
// as a total.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace zest {

enum class MemoryCategory : uint8_t {
  kParameters,      // compute-dtype model parameters (full, or the owned shard)
  kGradients,       // gradient buffers (full, or the owned shard)
  kMasterWeights,   // fp32 master copy of the parameters
  kOptimizerState,  // optimizer moments and the like
  kCommBuffers,     // reduce-scatter / all-gather buckets and staging
  kWorkspace,       // activations and scratch of the user's loop
  kOther,
};

inline constexpr size_t kNumMemoryCategories = 7;

inline constexpr std::array<MemoryCategory, kNumMemoryCategories> kAllMemoryCategories = {
    MemoryCategory::kParameters,     MemoryCategory::kGradients,   MemoryCategory::kMasterWeights,
    MemoryCategory::kOptimizerState, MemoryCategory::kCommBuffers, MemoryCategory::kWorkspace,
    MemoryCategory::kOther};

constexpr std::string_view category_name(MemoryCategory c) {
  switch (c) {
    case MemoryCategory::kParameters: return "parameters";
    case MemoryCategory::kGradients: return "gradients";
    case MemoryCategory::kMasterWeights: return "master_weights";
    case MemoryCategory::kOptimizerState: return "optimizer_state";
    case MemoryCategory::kCommBuffers: return "comm_buffers";
    case MemoryCategory::kWorkspace: return "workspace";
    case MemoryCategory::kOther: return "other";
  }
  return "unknown";
}

constexpr size_t category_index(MemoryCategory c) { return static_cast<size_t>(c); }

}  // namespace zest
