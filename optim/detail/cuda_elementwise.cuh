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
#include "zest/optim/vector_lanes.h"

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

// Eight elements from p + i, i a multiple of 8 and p 16-byte aligned (Note
// [16-byte vectors] in vector_lanes.h): two 16-byte loads of fp32, one of
// fp16 or bf16.
__device__ inline void load8(const float* p, size_t i, float* f) {
  const float4 a = *reinterpret_cast<const float4*>(p + i);
  const float4 b = *reinterpret_cast<const float4*>(p + i + 4);
  f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w;
  f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
}
__device__ inline Lanes16 load_lanes(const void* p) {
  const uint4 u = *reinterpret_cast<const uint4*>(p);
  return Lanes16{{u.x, u.y, u.z, u.w}};
}
__device__ inline void load8(const fp16* p, size_t i, float* f) {
  const Lanes16 l = load_lanes(p + i);
  for (unsigned k = 0; k < kVecElems; ++k) f[k] = __half2float(__ushort_as_half(lane16(l, k)));
}
__device__ inline void load8(const bf16* p, size_t i, float* f) {
  const Lanes16 l = load_lanes(p + i);
  for (unsigned k = 0; k < kVecElems; ++k) f[k] = __bfloat162float(__ushort_as_bfloat16(lane16(l, k)));
}

__device__ inline void store8(float* p, size_t i, const float* f) {
  *reinterpret_cast<float4*>(p + i) = make_float4(f[0], f[1], f[2], f[3]);
  *reinterpret_cast<float4*>(p + i + 4) = make_float4(f[4], f[5], f[6], f[7]);
}
__device__ inline void store_lanes(void* p, const Lanes16& l) {
  *reinterpret_cast<uint4*>(p) = make_uint4(l.word[0], l.word[1], l.word[2], l.word[3]);
}
__device__ inline void store8(fp16* p, size_t i, const float* f) {
  Lanes16 l{};
  for (unsigned k = 0; k < kVecElems; ++k) set_lane16(l, k, __half_as_ushort(__float2half_rn(f[k])));
  store_lanes(p + i, l);
}
__device__ inline void store8(bf16* p, size_t i, const float* f) {
  Lanes16 l{};
  for (unsigned k = 0; k < kVecElems; ++k) set_lane16(l, k, __bfloat16_as_ushort(__float2bfloat16_rn(f[k])));
  store_lanes(p + i, l);
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

// Blocks for a vector launch over n elements (for_each_vector).
inline unsigned vector_blocks(size_t n) { return elementwise_blocks(vector_threads(n)); }

// The grid-stride loop's first index and stride, 64-bit: shards may pass 2^32.
__device__ inline size_t first_index() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline size_t grid_stride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

}  // namespace zest::detail
