// Elementwise reduction of several host arrays, shared by the host backends.
//
// Inputs are combined in the order given (rank order), so every rank that
// reduces the same inputs gets the same bits, whatever the backend. fp16 and
// bf16 accumulate in float and round once at the end: the result differs from
// the exact sum by the dtype's own rounding only, never by rounding at every
// step. Integer sums wrap around like NCCL's. Max propagates NaN, so an
// overflow anywhere is seen everywhere.
#pragma once

#include <cstddef>

#include "zest/comm/collective.h"
#include "zest/core/dtype.h"

namespace zest {

// out[i] = op(inputs[0][i], ..., inputs[n-1][i]) for i < count. For kAvg the
// sum is divided by `num_inputs`. `out` may alias any input.
void host_reduce(const void* const* inputs, int num_inputs, void* out, size_t count, DType dtype,
                 ReduceOp op);

}  // namespace zest
