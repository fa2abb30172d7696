// Elementwise operations on gradient and parameter buffers of fp32, fp16 or
// bf16, ordered on a stream: what the engine does between its collectives and
// the optimizer step.
//
//   // zest-example: prelude=buffers
//   accumulate(comm_stream, grad_acc, reduced_shard, DType::kBFloat16, shard_numel);
//   convert(stream, master, DType::kFloat32, params, DType::kBFloat16, numel);
//   scale(comm_stream, grads, DType::kFloat16, 0.25f, numel);
//
// All compute in float and round once to the destination's dtype, to nearest
// even, on the host and in CUDA kernels alike, with the same bits on both
// (tests/cuda/test_cuda_optim.cu) except for the payload of a NaN, which a GPU
// may replace by its canonical NaN; NaN stays NaN and Inf stays Inf. Being
// elementwise, neither result depends on how a buffer is sharded.
//
// n counts elements, not bytes. n == 0 is a no-op; a null pointer with n > 0
// and a dtype other than fp32, fp16 or bf16 are zest::Errors. On a CUDA
// stream the buffers are memory of the stream's device and the work is queued
// there; on a host stream it runs now, or is queued on the stream's own
// thread where it has one (HostWork::kOwnThread).
#pragma once

#include <cstddef>

#include "zest/core/dtype.h"
#include "zest/core/stream.h"

namespace zest {

// dst[i] = dst[i] + src[i], both of `dtype`, added in float and rounded once
// to dtype: the sum of two fp16 (or bf16) values is rounded only when it is
// stored. Accumulates reduced gradients across micro-steps. src may equal
// dst; other overlap is not allowed.
void accumulate(const Stream& stream, void* dst, const void* src, DType dtype, size_t n);
// The same into a buffer of another dtype: dst (dst_dtype) += src
// (src_dtype), added in float and rounded once to dst_dtype. The engine
// accumulates compute-dtype gradients into grad_accum_dtype buffers with it
// (bf16 into fp32, where each sum is exact as long as fp32 can hold it).
void accumulate(const Stream& stream, void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t n);

// buf[i] = buf[i] * factor, multiplied in float and rounded once to dtype:
// torch's tensor.mul_(factor) on fp32, fp16 and bf16 alike (the factor
// taken as a float). The engine divides gradients before and after their
// reduction with it (prescale_gradients, gradient_predivide_factor).
void scale(const Stream& stream, void* buf, DType dtype, float factor, size_t n);

// dst[i] = src[i] converted from src_dtype to dst_dtype, for any pair of
// fp32, fp16 and bf16. Widening is exact; narrowing rounds to nearest even
// (fp16 overflows to Inf past 65504, as a cast does). Equal dtypes copy the
// bytes unchanged. src and dst must not overlap (unless equal, with equal
// dtypes).
void convert(const Stream& stream, const void* src, DType src_dtype, void* dst, DType dst_dtype,
             size_t n);

// Whether any of n values of `dtype` (fp32, fp16 or bf16) in host memory is
// a NaN or an Inf, judged on their bits in one pass that vectorizes for the
// widest instruction set the CPU has (a loader checks every element it
// reads with it, so it runs at memory speed).
bool any_non_finite_host(const void* values, DType dtype, size_t n);

}  // namespace zest
