// The LAMB optimizer's step (DeepSpeed's Lamb / FusedLamb; the formula is in
// optim/detail/lamb_impl.h): an Adam-style update u scaled, per parameter tensor, by
// the trust ratio ||w|| / ||u||. A parameter may be split across ranks'
// shards and across the runs of a unit's shard, so the step is two passes
// with a reduction between them:
//
//   lamb_moments       m, v of the owned elements; for each piece, the sums
//                      of w^2 and u^2 (w before the step)
//   lamb_accumulate    the pieces' sums added exactly into each parameter's
//                      words (exact_sum.h), ready for an int64 sum all-reduce
//   (all-reduce the words across the shards' ranks)
//   lamb_trust_ratios  each parameter's ratio from its two exact sums
//   lamb_apply         w -= step_size * ratio * u, u recomputed from m, v, w
//                      with the bits of the first pass; the compute-dtype copy
//
// Note [LAMB's norms do not depend on the sharding]. A piece is the part of
// one parameter inside one chunk of kShardQuantum (256) elements of its
// unit's flat buffer, counted from the buffer's start. Shards start at
// multiples of 256, so a piece is whole in one shard whatever the world size
// and stage, and lamb_pieces cuts the same pieces from any shard. Each piece
// is summed in Note [a warp per chunk]'s lanes and tree (chunk_sum_order.h),
// the lanes in double as its fallback's are (lane l adds elements l, l + 32,
// ... in order; this pass computes each element's update anyway, so the
// widening is not what bounds it), on the host and on the GPU, and the
// pieces are added exactly, so every parameter's
// norms, its ratio and the weights after the step have the same bits at every
// stage and world size, as the global gradient norm does (grad_norm.h).
//
// Every function takes the step's StepScalars: with a decision
// (step_decision.h) lamb_moments and lamb_apply do nothing on a skipped step
// and take the decision's grad_scale. Host streams run now; CUDA streams
// queue kernels, every buffer then being memory of the stream's device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "zest/core/stream.h"
#include "zest/optim/optimizer.h"

namespace zest {

// Elements [begin, begin + numel) of a ShardBuffers, all of parameter
// `param` (an index into the words and ratios), numel <= kLambPieceMax.
struct LambPiece {
  uint64_t begin = 0;
  uint32_t numel = 0;
  uint32_t param = 0;
};

inline constexpr size_t kLambPieceMax = 256;  // kShardQuantum: the norm's chunk

// Appends the pieces of parameter `param`, whose elements are [begin, end)
// of a shard that starts at a multiple of kLambPieceMax of its flat buffer:
// cut at the multiples of kLambPieceMax from the shard's start, then given
// relative to `base` (begin >= base: the start of the ShardBuffers they
// index).
void lamb_pieces(std::vector<LambPiece>& out, size_t begin, size_t end, size_t base, uint32_t param);

// Pass 1 over `count` pieces of `shard` (state[0] = m, state[1] = v):
// sums[2 i] and sums[2 i + 1] are piece i's sums of w^2 and u^2.
void lamb_moments(const Stream& stream, const OptimizerConfig& config, const ShardBuffers& shard,
                  const StepScalars& scalars, const LambPiece* pieces, size_t count, double* sums);

// Adds the pieces' sums exactly into the words of `params` parameters
// (zeroed, or normalized by an earlier call): parameter p's sum of w^2 at
// words[2 p * kExactWords], of u^2 at words[(2 p + 1) * kExactWords]. Every
// piece's param must be below `params`. Leaves the words normalized, ready
// for an int64 sum all-reduce.
void lamb_accumulate(const Stream& stream, const LambPiece* pieces, const double* sums, size_t count,
                     size_t params, int64_t* words);

// ratios[p] for the `params` parameters, from words as lamb_accumulate
// wrote them (all-reduced).
void lamb_trust_ratios(const Stream& stream, const OptimizerConfig& config, const int64_t* words,
                       size_t params, float* ratios);

// Pass 2: the pieces' weights stepped, with their compute-dtype copy.
void lamb_apply(const Stream& stream, const OptimizerConfig& config, const ShardBuffers& shard,
                const StepScalars& scalars, const LambPiece* pieces, size_t count, const float* ratios);

}  // namespace zest
