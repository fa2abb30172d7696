// core/float16.h's float -> bf16 rounding on 8 floats in AVX2 instructions,
// for the host loops that narrow to bf16 (core/float16_arrays.cpp,
// comm/host_reduce.cpp): GCC vectorizes the scalar function on AVX2 at
// about twice the instructions. Internal; x86 only (ZEST_X86_DISPATCH).
#pragma once

#include "zest/core/cpu_isa.h"

#if ZEST_X86_DISPATCH
#include <immintrin.h>

namespace zest::detail {

// float_to_bf16_bits of 8 floats, each in the high half of its 32-bit lane
// (the low half is left as it comes: the caller shifts it out). Round to
// nearest even by adding 0x7fff and the kept part's lowest bit; a NaN keeps
// its sign and top payload bits and gets the quiet bit instead.
ZEST_TARGET_AVX2 inline __m256i round_bf16x8(__m256 f) {
  const __m256i x = _mm256_castps_si256(f);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), odd);
  const __m256i quiet_nan = _mm256_or_si256(x, _mm256_set1_epi32(0x00400000));
  const __m256 nan = _mm256_cmp_ps(f, f, _CMP_UNORD_Q);
  return _mm256_blendv_epi8(rounded, quiet_nan, _mm256_castps_si256(nan));
}

// 16 rounded floats (two round_bf16x8 results, in order) as 16 bf16 in
// order: packus works within 128-bit lanes, so the permute restores the
// order; the values shifted down fit its unsigned saturation.
ZEST_TARGET_AVX2 inline __m256i pack_bf16x16(__m256i lo8, __m256i hi8) {
  const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(lo8, 16), _mm256_srli_epi32(hi8, 16));
  return _mm256_permute4x64_epi64(packed, 0xd8);
}

}  // namespace zest::detail
#endif
