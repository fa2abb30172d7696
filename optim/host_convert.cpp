// The host conversions of host_convert.h. Built with the vectorizing flags of
// optim/CMakeLists.txt; the fp16 and bf16 conversions of core/float16.h are
// branch-free so that these loops vectorize.
#include "zest/optim/host_convert.h"

#include <cstdlib>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define ZEST_F16C_PATH 1
#else
#define ZEST_F16C_PATH 0
#endif

namespace zest::detail {
namespace {

#if ZEST_F16C_PATH
// fp16 <-> float with F16C's instructions, where the CPU has them (decided at
// run time: the build assumes only baseline x86-64). They give
// core/float16.h's bits: both round to nearest even, are exact for
// subnormals, and quiet a NaN keeping its sign and top payload bits; the
// immediate 0 asks for round-to-nearest-even whatever MXCSR says.
// test_optimizer_bits compares the two on NaN, Inf, subnormals and overflow.
bool cpu_has_f16c() {
  // cpuid for F16C itself (not every compiler's __builtin_cpu_supports knows
  // it); "avx" also checks that the OS saves the AVX registers. ZEST_NO_F16C
  // selects the portable loops, for tests and for comparing the two.
  static const bool has = [] {
    if (const char* off = std::getenv("ZEST_NO_F16C"); off != nullptr && *off != '\0' && *off != '0') {
      return false;
    }
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0 &&
           __builtin_cpu_supports("avx");
  }();
  return has;
}

__attribute__((target("avx,f16c"))) void widen_f16c(const fp16* in, float* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

__attribute__((target("avx,f16c"))) void narrow_f16c(const float* in, fp16* out, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(in + i), 0);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), h);
  }
  for (; i < n; ++i) out[i] = fp16(in[i]);
}
#endif

template <typename T>
void widen_loop(const T* __restrict in, float* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

template <typename T>
void narrow_loop(const float* __restrict in, T* __restrict out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = T(in[i]);
}

}  // namespace

void widen(const fp16* in, float* out, size_t n) {
#if ZEST_F16C_PATH
  if (cpu_has_f16c()) return widen_f16c(in, out, n);
#endif
  widen_loop(in, out, n);
}

void widen(const bf16* in, float* out, size_t n) { widen_loop(in, out, n); }

void narrow(const float* in, fp16* out, size_t n) {
#if ZEST_F16C_PATH
  if (cpu_has_f16c()) return narrow_f16c(in, out, n);
#endif
  narrow_loop(in, out, n);
}

void narrow(const float* in, bf16* out, size_t n) { narrow_loop(in, out, n); }


}  // namespace zest::detail
