// The vector instruction sets the host loops may use, chosen at run time.
//
// Note [ISA dispatch]: the build targets baseline x86-64 (SSE2), so one
// binary runs on every x86-64 machine. The hot host loops (optimizer
// updates, fp16/bf16 conversions, host reductions) are compiled once more
// per wider instruction set, as functions carrying a target attribute
// (ZEST_TARGET_AVX2 / ZEST_TARGET_AVX512 below) whose bodies are the same
// element functions the baseline loop inlines. They are called only when
// cpuid says the CPU and the OS support that set. Header functions stay
// baseline (the attribute is on the loop, not on what it inlines), so no
// out-of-line copy built for a wider set can be picked by the linker for a
// baseline caller. Every path gives the same bits: the loops perform the
// same IEEE operations per element, no contraction into FMA
// (-ffp-contract=off on those files; an FMA is written out where the
// element function calls std::fma), and test_optimizer_bits and
// test_host_reduce run every path the CPU has.
//
// ZEST_CPU_ISA=baseline|avx2|avx512 caps the choice (for tests and for
// comparing paths); ScopedCpuIsa does the same within a process.
#pragma once

#include <string_view>
#include <vector>

namespace zest {

enum class CpuIsa { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };

std::string_view cpu_isa_name(CpuIsa isa);

// Whether this CPU (and the OS, for the wider registers) can run `isa`'s
// loops: kAvx2 needs AVX2, FMA and F16C, kAvx512 needs AVX-512 F, BW and VL too.
bool cpu_supports(CpuIsa isa);

// The widest supported set, capped by ZEST_CPU_ISA and by a ScopedCpuIsa.
// Throws a zest::Error naming the accepted values if ZEST_CPU_ISA is not one.
CpuIsa host_isa();

// Every supported set, narrowest first.
std::vector<CpuIsa> supported_cpu_isas();

// Caps host_isa() at `isa` (which must be supported) for this object's
// lifetime, in every thread: for tests that run each path in turn.
class ScopedCpuIsa {
 public:
  explicit ScopedCpuIsa(CpuIsa isa);
  ~ScopedCpuIsa();
  ScopedCpuIsa(const ScopedCpuIsa&) = delete;
  ScopedCpuIsa& operator=(const ScopedCpuIsa&) = delete;

 private:
  int previous_;
};

}  // namespace zest

#if (defined(__x86_64__) || defined(__i386__)) && (defined(__GNUC__) || defined(__clang__))
#define ZEST_X86_DISPATCH 1
#define ZEST_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define ZEST_TARGET_AVX512 \
  __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#else
#define ZEST_X86_DISPATCH 0
#endif
