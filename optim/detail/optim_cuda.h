// Internal: the CUDA side of optim's entry points. The public functions check
// their arguments, run host streams themselves and hand CUDA streams to these,
// which queue kernels on the stream's device. Implemented in the .cu files of
// optim/ (optimizer_cuda.cu, lamb_cuda.cu, grad_norm.cu, grad_ops.cu); in a build without
// CUDA, optim_cuda_stub.cpp stands in (unreachable there: no CUDA stream can
// be created).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/core/dtype.h"
#include "zest/core/stream.h"
#include "zest/optim/lamb.h"
#include "zest/optim/detail/lamb_impl.h"
#include "zest/optim/optimizer.h"

namespace zest {
struct StepDecision;  // step_decision.h
}  // namespace zest

namespace zest::detail {

void optimizer_step_cuda(const Stream& stream, const OptimizerConfig& config,
                         const ShardBuffers& shard, const StepScalars& scalars);

// LAMB (lamb.h; lamb_cuda.cu).
void lamb_moments_cuda(const Stream& stream, const LambStep& step, const StepDecision* decision,
                       const ShardBuffers& shard, const LambPiece* pieces, size_t count, double* sums);
void lamb_accumulate_cuda(const Stream& stream, const LambPiece* pieces, const double* sums, size_t count,
                          size_t params, int64_t* words);
void lamb_trust_ratios_cuda(const Stream& stream, const int64_t* words, size_t params, float min_coeff,
                            float max_coeff, float* ratios);
void lamb_apply_cuda(const Stream& stream, const LambStep& step, const StepDecision* decision,
                     const ShardBuffers& shard, const LambPiece* pieces, size_t count, const float* ratios);

void chunk_sums_of_squares_cuda(const Stream& stream, const void* grad, DType dtype, size_t numel,
                                size_t chunk_numel, float scale, double* out);

void accumulate_exact_cuda(const Stream& stream, const double* sums, size_t count, int64_t* acc);

void decide_step_cuda(const Stream& stream, int64_t* words, double unscale, double max_norm);

void accumulate_cuda(const Stream& stream, void* dst, DType dst_dtype, const void* src, DType src_dtype,
                     size_t n);

void scale_cuda(const Stream& stream, void* buf, DType dtype, float factor, size_t n);

// src_dtype != dst_dtype: equal dtypes are a copy, which grad_ops.cpp queues.
void convert_cuda(const Stream& stream, const void* src, DType src_dtype, void* dst, DType dst_dtype,
                  size_t n);

}  // namespace zest::detail
