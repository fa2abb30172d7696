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

// outputs[j][i] = op(inputs[0][i], ..., inputs[n-1][i]) for i < count and
// every j. For kAvg the sum is divided by `num_inputs`. An output may be the
// very pointer of an input (in place), but no array may overlap another
// partly. Blocks of a few KiB are reduced in a buffer that stays in L1, one
// input at a time (so each input streams once), then stored to every
// output; the loops are compiled for the widest instruction set the CPU has
// (Note [ISA dispatch] in core/cpu_isa.h), which changes no bit.
void host_reduce(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
                 size_t count, DType dtype, ReduceOp op);

inline void host_reduce(const void* const* inputs, int num_inputs, void* out, size_t count,
                        DType dtype, ReduceOp op) {
  void* outputs[] = {out};
  host_reduce(inputs, num_inputs, outputs, 1, count, dtype, op);
}

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
