#include "zest/core/cpu_isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "zest/core/check.h"

#if ZEST_X86_DISPATCH
#include <cpuid.h>
#endif

namespace zest {
namespace {

// -1: no ScopedCpuIsa in force.
std::atomic<int> g_forced{-1};

bool detect(CpuIsa isa) {
#if ZEST_X86_DISPATCH
  switch (isa) {
    case CpuIsa::kBaseline: return true;
    case CpuIsa::kAvx2: {
      unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
      const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
      // __builtin_cpu_supports also checks that the OS saves the registers.
      return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    case CpuIsa::kAvx512:
      return detect(CpuIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  }
  return false;
#else
  return isa == CpuIsa::kBaseline;
#endif
}

CpuIsa parse_env_cap() {
  const char* text = std::getenv("ZEST_CPU_ISA");
  if (text == nullptr || *text == '\0') return CpuIsa::kAvx512;
  const std::string_view v = text;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (v == cpu_isa_name(isa)) return isa;
  }
  ZEST_FAIL("ZEST_CPU_ISA is '{}'; set it to baseline, avx2 or avx512 (or unset it for the widest "
            "the CPU has)",
            v);
}

CpuIsa best_supported() {
  static const CpuIsa best = [] {
    const CpuIsa cap = parse_env_cap();
    for (CpuIsa isa : {CpuIsa::kAvx512, CpuIsa::kAvx2}) {
      if (isa <= cap && detect(isa)) return isa;
    }
    return CpuIsa::kBaseline;
  }();
  return best;
}

}  // namespace

std::string_view cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kBaseline: return "baseline";
    case CpuIsa::kAvx2: return "avx2";
    case CpuIsa::kAvx512: return "avx512";
  }
  return "unknown";
}

bool cpu_supports(CpuIsa isa) {
  static const bool has[3] = {true, detect(CpuIsa::kAvx2), detect(CpuIsa::kAvx512)};
  return has[static_cast<int>(isa)];
}

CpuIsa host_isa() {
  const CpuIsa best = best_supported();
  const int forced = g_forced.load(std::memory_order_relaxed);
  if (forced >= 0 && forced < static_cast<int>(best)) return static_cast<CpuIsa>(forced);
  return best;
}

std::vector<CpuIsa> supported_cpu_isas() {
  std::vector<CpuIsa> out;
  for (CpuIsa isa : {CpuIsa::kBaseline, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (cpu_supports(isa)) out.push_back(isa);
  }
  return out;
}

ScopedCpuIsa::ScopedCpuIsa(CpuIsa isa) : previous_(g_forced.load()) {
  ZEST_CHECK(cpu_supports(isa), "ScopedCpuIsa: this CPU cannot run {} loops; pick one of "
                                "supported_cpu_isas()",
             cpu_isa_name(isa));
  g_forced.store(static_cast<int>(isa));
}

ScopedCpuIsa::~ScopedCpuIsa() { g_forced.store(previous_); }

}  // namespace zest
