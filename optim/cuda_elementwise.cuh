// Internal, for optim's .cu files: element loads and stores of ZEST's storage
// types in float, and the launch shape of grid-stride kernels.
//
// fp16 and bf16 go through CUDA's own conversions (one cvt instruction each,
// where core/float16.h's portable integer code takes a dozen). They round to
// nearest even like the host's conversions and widen exactly, so the bits
// agree with the host's; only a NaN may come out as CUDA's canonical NaN
// rather than with the host's payload (tests/cuda/test_cuda_float16.cu holds
// both to this over every 16-bit pattern and the rounding boundaries).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstddef>

#include "zest/core/float16.h"

namespace zest::detail {

__device__ inline float load_float(const float* p, size_t i) { return p[i]; }
__device__ inline float load_float(const fp16* p, size_t i) {
  return __half2float(__ushort_as_half(p[i].bits));
}
__device__ inline float load_float(const bf16* p, size_t i) {
  return __bfloat162float(__ushort_as_bfloat16(p[i].bits));
}

__device__ inline void store_float(float* p, size_t i, float v) { p[i] = v; }
__device__ inline void store_float(fp16* p, size_t i, float v) {
  p[i].bits = __half_as_ushort(__float2half_rn(v));
}
__device__ inline void store_float(bf16* p, size_t i, float v) {
  p[i].bits = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

// Threads per block of the elementwise kernels.
constexpr unsigned kElementwiseThreads = 256;

// Blocks for `n` elements: one element per thread up to a cap that fills any
// current GPU several times over; past it the grid-stride loop takes the rest.
inline unsigned elementwise_blocks(size_t n) {
  constexpr size_t kMaxBlocks = 4096;
  return static_cast<unsigned>(
      std::min(kMaxBlocks, (n + kElementwiseThreads - 1) / kElementwiseThreads));
}

// The grid-stride loop's first index and stride, 64-bit: shards may pass 2^32.
__device__ inline size_t first_index() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline size_t grid_stride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

}  // namespace zest::detail
