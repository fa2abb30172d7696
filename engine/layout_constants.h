// The numbers and rules that fix ZEST's flat layout, shared by the engine,
// the memory estimator and the checkpoint tools, so that what is estimated
// is what is allocated and what a reshard writes is what an engine reads.
//
// kParamAlign: every parameter starts at a multiple of 64 elements of its
// unit's flat buffer (128 bytes in fp16, 256 in fp32), so typed views and
// vectorized kernels see aligned memory.
//
// kShardQuantum: a unit's flat buffer is padded to a multiple of
// partitions x 256 elements, so every shard is a whole number of
// gradient-norm chunks (optim/grad_norm.h) and the norm, the exact sum of
// the chunks' sums, is the same bit for bit whatever the world size. It also
// keeps every shard a multiple of 512 bytes in fp16, so allocator rounding never
// adds to the model-state bytes.
#pragma once

#include <cstddef>
#include <cstdint>

namespace zest {

inline constexpr size_t kParamAlign = 64;
inline constexpr size_t kShardQuantum = 256;

// finalize() moves initial values to the device through an fp32 staging
// buffer of at most this many elements (64 MiB), piece by piece.
inline constexpr size_t kInitStagingNumel = size_t{1} << 24;

// The offset at which a parameter placed after `offset` elements starts.
constexpr size_t aligned_param_offset(size_t offset) {
  return (offset + kParamAlign - 1) / kParamAlign * kParamAlign;
}

// The flat size of a unit whose last parameter ends at `unaligned_end`,
// split into `partitions` equal shards.
constexpr size_t padded_unit_numel(size_t unaligned_end, int partitions) {
  const size_t quantum = kShardQuantum * static_cast<size_t>(partitions);
  return (unaligned_end + quantum - 1) / quantum * quantum;
}

// The shards a unit is split into: one at stage 0 (every rank holds and
// updates everything), one per rank at stages 1-3.
constexpr int partitions_for(int stage, int world) { return stage == 0 ? 1 : world; }

// Whether a unit of `numel` parameters stays whole on every rank (resident)
// rather than gathered on demand: always below stage 3; at stage 3 when it
// is no larger than stage3_param_persistence_threshold, as in DeepSpeed, and
// on a single partition unless offload_param keeps it in host memory. Note
// [one partition keeps stage 3 resident]: one rank's shard is the whole
// unit, so a gather would only copy it into a second buffer of the same
// size (and a release free that copy); resident, the shard is the full
// parameters, and the values, hence the bits, are the same.
constexpr bool resident_unit(int stage, int partitions, bool offload_param, size_t numel,
                             int64_t persistence_threshold) {
  return stage < 3 || (partitions == 1 && !offload_param) || static_cast<int64_t>(numel) <= persistence_threshold;
}

}  // namespace zest
