// Sums of squares of gradient shards, in fixed chunks, for a global gradient
// norm that does not depend on how the gradients are sharded.
//
// Floating-point addition is not associative, so a norm summed over shards
// would change in its last bits with the number of ranks, and with it the
// clipping factor and every parameter after it. Instead each chunk of
// `chunk_numel` consecutive elements (counted in the unsharded buffer) is
// summed on its own, in an order fixed by the chunk alone (Note [a warp per
// chunk], chunk_sum_order.h: 32 lanes in float, their tree in double).
// Shard boundaries are kept at multiples of the chunk size, so each chunk
// lies in one shard and is summed the same way whatever the world size.
//
// The chunk sums are then added exactly (optim/exact_sum.h): each rank adds
// its own chunks into kExactWords integers, and an int64 sum all-reduce adds
// the ranks' words. Integer addition is associative, so the total has the
// same bits whatever the world size, the stage and the order of the ranks,
// and no rank holds more than its own shard's chunk sums: memory and work
// O(shard / chunk_numel), communication O(1).
//
// An Inf or NaN gradient makes its chunk's sum non-finite, so the same pass
// detects overflow; a finite chunk whose squares overflow float is summed in
// double instead (Note [float lanes, double fallback]), so it stays finite.
//
// On a CUDA stream one warp sums each chunk in the same order, with the same
// operations, so the host and the GPU give each chunk the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/core/dtype.h"
#include "zest/core/stream.h"

namespace zest {

// out[c] = sum over i in chunk c of (scale * grad[i])^2, for the
// ceil(numel / chunk_numel) chunks of `grad`. `out` is on the stream's device.
// Each chunk is added in Note [a warp per chunk]'s order (chunk_sum_order.h)
// on the host as on the GPU, so both give the same bits.
void chunk_sums_of_squares(const Stream& stream, const void* grad, DType dtype, size_t numel,
                           size_t chunk_numel, float scale, double* out);

// Adds the chunk sums in order (on the host): the square of the global norm.
double sum_in_order(const double* sums, size_t count);

// Adds `count` chunk sums (as chunk_sums_of_squares writes them) exactly into
// acc[kExactWords] (exact_sum.h), and leaves acc normalized, ready for an
// int64 sum all-reduce. Both are on the stream's device.
void accumulate_exact(const Stream& stream, const double* sums, size_t count, int64_t* acc);

}  // namespace zest
