// Note [16-byte vectors]. The elementwise kernels (optimizer updates,
// accumulate, convert) move their data in 16-byte loads and stores: eight
// elements at a time, two float4 for fp32 and one uint4 for fp16 and bf16.
// The engine's layout makes that the common case: parameters start at
// multiples of 64 elements and shards at multiples of 256 in buffers the
// allocator aligns to 512 bytes, so every run the optimizer steps starts
// 16-byte aligned. A launch checks every pointer and falls back to one element
// per thread otherwise; a run's last n % 8 elements go one at a time.
//
// What is shared with the host, and tested there: the order of the lanes in
// a 16-byte word (lane16/set_lane16, little-endian as both the host and the
// GPU are), the split of [0, n) into whole vectors and a tail (for_each_vector,
// the kernels' very loop) and the alignment rule. The arithmetic on each
// element is the one-element body the scalar kernels and the host run
// (optimizer_impl.h), so the bits do not change.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "zest/core/platform.h"

namespace zest::detail {

inline constexpr size_t kVecElems = 8;  // elements per vector step (16 bytes of 16-bit values)
inline constexpr size_t kVecBytes = 16;

// Sixteen bytes as four 32-bit words: eight 16-bit lanes, lane k in the low
// (k even) or high (k odd) half of word k / 2.
struct Lanes16 {
  uint32_t word[4];
};

ZEST_HOST_DEVICE inline uint16_t lane16(const Lanes16& p, unsigned k) {
  return static_cast<uint16_t>(p.word[k >> 1] >> (16 * (k & 1)));
}

ZEST_HOST_DEVICE inline void set_lane16(Lanes16& p, unsigned k, uint16_t bits) {
  const unsigned shift = 16 * (k & 1);
  p.word[k >> 1] = (p.word[k >> 1] & ~(0xffffu << shift)) | (static_cast<uint32_t>(bits) << shift);
}

// Calls vec(i) for i = 0, 8, 16, ... while i + 8 <= n, and one(i) for the
// n % 8 elements after them, over a grid of threads: this thread is `first`
// of `stride` (a kernel passes first_index() and grid_stride()). Every index
// below n is visited by exactly one thread, once.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename Vec, typename One>
ZEST_HOST_DEVICE inline void for_each_vector(size_t n, size_t first, size_t stride, Vec&& vec, One&& one) {
  const size_t groups = n / kVecElems;
  for (size_t g = first; g < groups; g += stride) vec(g * kVecElems);
  for (size_t i = groups * kVecElems + first; i < n; i += stride) one(i);
}

// Threads a vector launch needs for n elements: one per vector, and at least
// the tail's.
ZEST_HOST_DEVICE inline size_t vector_threads(size_t n) {
  const size_t groups = n / kVecElems;
  const size_t tail = n % kVecElems;
  return groups > tail ? groups : tail;
}

// True when every non-null pointer is 16-byte aligned (null ones are absent
// outputs).
inline bool vector_aligned(std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % kVecBytes != 0) return false;
  }
  return true;
}

}  // namespace zest::detail
