// The HostKernels tables: the loops of host_kernels.inc for baseline x86-64,
// AVX2 and AVX-512, and F16C's fp16 conversions. Built with the flags of
// optim/CMakeLists.txt (no FMA contraction; vectorizing options).
#include "zest/optim/host_kernels.h"

#include <cstdlib>
#include <cstring>

#if ZEST_X86_DISPATCH
#include <immintrin.h>
#endif

namespace zest::detail {
namespace {

#define ZEST_KERNEL_NS baseline
#define ZEST_KERNEL_TARGET
#include "zest/optim/host_kernels.inc"
#undef ZEST_KERNEL_NS
#undef ZEST_KERNEL_TARGET

#if ZEST_X86_DISPATCH
#define ZEST_KERNEL_NS avx2
#define ZEST_KERNEL_TARGET ZEST_TARGET_AVX2
#define ZEST_KERNEL_VECTOR_BYTES 32
#include "zest/optim/host_kernels.inc"
#undef ZEST_KERNEL_NS
#undef ZEST_KERNEL_TARGET
#undef ZEST_KERNEL_VECTOR_BYTES

#define ZEST_KERNEL_NS avx512
#define ZEST_KERNEL_TARGET ZEST_TARGET_AVX512
#define ZEST_KERNEL_VECTOR_BYTES 64
#include "zest/optim/host_kernels.inc"
#undef ZEST_KERNEL_NS
#undef ZEST_KERNEL_TARGET
#undef ZEST_KERNEL_VECTOR_BYTES

// fp16 <-> float with F16C's instructions. They give core/float16.h's bits:
// both round to nearest even, are exact for subnormals, and quiet a NaN
// keeping its sign and top payload bits; the immediate 0 asks for
// round-to-nearest-even whatever MXCSR says. test_optimizer_bits compares
// the two on NaN, Inf, subnormals and overflow.
bool cpu_has_f16c() {
  // F16C comes with every AVX2 CPU (cpu_supports checks cpuid for it), and
  // "avx" means the OS saves the registers. ZEST_NO_F16C selects the
  // portable loops, for tests and for comparing the two.
  static const bool has = [] {
    if (const char* off = std::getenv("ZEST_NO_F16C"); off != nullptr && *off != '\0' && *off != '0') {
      return false;
    }
    return cpu_supports(CpuIsa::kAvx2);
  }();
  return has;
}

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
#else
bool cpu_has_f16c() { return false; }
#endif

#define ZEST_KERNEL_TABLE(ns, isa_value)                                                           \
  HostKernels {                                                                                    \
    isa_value, ns::adam<true>, ns::adam<false>, ns::sgd, ns::widen<fp16>, ns::narrow<fp16>,        \
        ns::widen<bf16>, ns::narrow<bf16>, ns::chunk_squares, ns::chunk_squares_bf16,              \
        ns::any_non_finite16, ns::any_non_finite32                                                 \
  }

HostKernels make_table(CpuIsa isa) {
  HostKernels k = ZEST_KERNEL_TABLE(baseline, CpuIsa::kBaseline);
#if ZEST_X86_DISPATCH
  if (isa == CpuIsa::kAvx2) k = ZEST_KERNEL_TABLE(avx2, CpuIsa::kAvx2);
  if (isa == CpuIsa::kAvx512) k = ZEST_KERNEL_TABLE(avx512, CpuIsa::kAvx512);
  if (cpu_has_f16c()) {
    k.widen_fp16 = widen_f16c;
    k.narrow_fp16 = narrow_f16c;
  }
#endif
  return k;
}

}  // namespace

const HostKernels& host_kernels() {
  static const HostKernels tables[] = {make_table(CpuIsa::kBaseline), make_table(CpuIsa::kAvx2),
                                       make_table(CpuIsa::kAvx512)};
  return tables[static_cast<int>(host_isa())];
}

}  // namespace zest::detail
