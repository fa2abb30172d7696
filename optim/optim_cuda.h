// Internal: the CUDA side of optim's entry points. The public functions check
// their arguments, run host streams themselves and hand CUDA streams to these,
// which queue kernels on the stream's device. Implemented in the .cu files of
// optim/ (optimizer_cuda.cu, grad_norm.cu, grad_ops.cu); in a build without
// CUDA, optim_cuda_stub.cpp stands in (unreachable there: no CUDA stream can
// be created).
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/core/dtype.h"
#include "zest/core/stream.h"
#include "zest/optim/optimizer.h"

namespace zest::detail {

void optimizer_step_cuda(const Stream& stream, const OptimizerConfig& config,
                         const ShardBuffers& shard, const StepScalars& scalars);

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
