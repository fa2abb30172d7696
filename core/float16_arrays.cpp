#include "zest/core/float16_arrays.h"

#include <cstdlib>

#include "zest/core/detail/bf16_avx2.h"
#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"

#if ZEST_X86_DISPATCH
#include <immintrin.h>
#endif

namespace zest::detail {

bool use_f16c() {
  static const bool use = [] {
    if (const char* off = std::getenv("ZEST_NO_F16C"); off != nullptr && *off != '\0' && *off != '0') {
      return false;
    }
    return cpu_supports(CpuIsa::kAvx2);
  }();
  return use;
}

#if ZEST_X86_DISPATCH
ZEST_TARGET_AVX2 void widen_f16c(const fp16* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

ZEST_TARGET_AVX2 void narrow_f16c(const float* in, fp16* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = fp16(in[i]);
}

ZEST_TARGET_AVX2 void narrow_bf16_avx2(const float* in, bf16* out, size_t n) {
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i lo = round_bf16x8(_mm256_loadu_ps(in + i));
    const __m256i hi = round_bf16x8(_mm256_loadu_ps(in + i + 8));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), pack_bf16x16(lo, hi));
  }
  for (; i < n; ++i) out[i] = bf16(in[i]);
}
#else
void widen_f16c(const fp16*, float*, size_t) { ZEST_INTERNAL_ASSERT(false, "F16C conversions on a CPU without them"); }
void narrow_f16c(const float*, fp16*, size_t) { ZEST_INTERNAL_ASSERT(false, "F16C conversions on a CPU without them"); }
void narrow_bf16_avx2(const float*, bf16*, size_t) { ZEST_INTERNAL_ASSERT(false, "AVX2 loops on a CPU without AVX2"); }
#endif

}  // namespace zest::detail
