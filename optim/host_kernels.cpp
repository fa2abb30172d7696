// The HostKernels tables: the loops of host_kernels.inc for baseline x86-64,
// AVX2 and AVX-512, with F16C's fp16 conversions where the CPU has them and
// AVX2's bf16 narrowing (core/float16_arrays.h). Built with the flags of
// optim/CMakeLists.txt (no FMA contraction; vectorizing options).
#include "zest/optim/detail/host_kernels.h"

#include <cstring>

#include "zest/core/float16_arrays.h"

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
  if (isa == CpuIsa::kAvx2) {
    k = ZEST_KERNEL_TABLE(avx2, CpuIsa::kAvx2);
    k.narrow_bf16 = narrow_bf16_avx2;  // core/detail/bf16_avx2.h: half GCC's instructions
  }
  if (isa == CpuIsa::kAvx512) k = ZEST_KERNEL_TABLE(avx512, CpuIsa::kAvx512);
  if (use_f16c()) {
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
