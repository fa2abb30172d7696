// Elementwise reduction of several host arrays, shared by the host backends.
//
// Inputs are combined in the order given (rank order), so every rank that
// reduces the same inputs gets the same bits, whatever the backend. fp16 and
// bf16 accumulate in float and round once at the end: the result differs from
// the exact sum by the dtype's own rounding only, never by rounding at every
// step. Integer sums wrap around like NCCL's. Max propagates NaN, so an
// overflow anywhere is seen everywhere.
#pragma once

#include <algorithm>
#include <cstddef>

#include "zest/comm/collective.h"
#include "zest/core/dtype.h"

namespace zest {

// out[i] = op(inputs[0][i], ..., inputs[n-1][i]) for i < count. For kAvg the
// sum is divided by `num_inputs`. `out` may alias any input.
void host_reduce(const void* const* inputs, int num_inputs, void* out, size_t count, DType dtype,
                 ReduceOp op);

// The elements [begin, begin + count) of an all-reduce of `total` elements
// that `rank` of `ranks` reduces in the host backends: ceil(total / ranks)
// each, fewer (or none) at the end. Each element is reduced by one rank.
struct ReduceChunk {
  size_t begin = 0;
  size_t count = 0;
};
inline ReduceChunk all_reduce_chunk(size_t total, int ranks, int rank) {
  const auto w = static_cast<size_t>(ranks);
  const size_t chunk = (total + w - 1) / w;
  const size_t begin = std::min(total, chunk * static_cast<size_t>(rank));
  return {begin, std::min(total - begin, chunk)};
}

}  // namespace zest
