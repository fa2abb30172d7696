// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float
// with the element updates of optimizer_impl.h that the CUDA kernel shares.
//
// The shard is walked in blocks of kBlock elements, each pass over a block a
// simple loop the compiler vectorizes: widen the gradient into a float buffer
// on the stack, update the block, narrow the new weights into the parameter
// copy. Vector and scalar float operations round alike (every one is an IEEE
// operation; no FMA, no reassociation, as optim/CMakeLists.txt sets), so the
// bits are those of one element at a time, and of the GPU.
#include <algorithm>
#include <cstdlib>
#include <type_traits>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <immintrin.h>
#define ZEST_F16C_PATH 1
#else
#define ZEST_F16C_PATH 0
#endif

#include "zest/optim/optimizer.h"
#include "zest/optim/optimizer_impl.h"

namespace zest::detail {
namespace {

// Small enough that a block's widened gradient stays in L1 for the update,
// large enough that the per-block overhead is negligible.
constexpr size_t kBlock = 2048;

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
void widen(const T* __restrict in, float* __restrict out, size_t n) {
#if ZEST_F16C_PATH
  if constexpr (std::is_same_v<T, fp16>) {
    if (cpu_has_f16c()) return widen_f16c(in, out, n);
  }
#endif
  for (size_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}

template <typename T>
void narrow(const float* __restrict in, T* __restrict out, size_t n) {
#if ZEST_F16C_PATH
  if constexpr (std::is_same_v<T, fp16>) {
    if (cpu_has_f16c()) return narrow_f16c(in, out, n);
  }
#endif
  for (size_t i = 0; i < n; ++i) out[i] = T(in[i]);
}

// Calls body(g, base, len) for each block, g the block's gradient as float:
// the shard's own memory when it is fp32, else widened into `scratch`.
template <typename TG, typename Body>
void for_each_block(const ShardBuffers& s, Body&& body) {
  const TG* grad = static_cast<const TG*>(s.grad);
  float scratch[kBlock];
  for (size_t base = 0; base < s.numel; base += kBlock) {
    const size_t len = std::min(kBlock, s.numel - base);
    const float* g = nullptr;
    if constexpr (std::is_same_v<TG, float>) {
      g = grad + base;
    } else {
      widen(grad + base, scratch, len);
      g = scratch;
    }
    body(g, base, len);
  }
}

template <typename TP>
void store_params(const ShardBuffers& s, size_t base, size_t len) {
  if constexpr (!std::is_void_v<TP>) narrow(s.master + base, static_cast<TP*>(s.param_out) + base, len);
}

// AdamStep by value: a local the compiler knows no store in the loop changes.
template <bool kDecoupled>
void adam_block(const AdamStep a, const float* __restrict g, float* __restrict w, float* __restrict m,
                float* __restrict v, size_t n) {
  for (size_t i = 0; i < n; ++i) adam_update_as<kDecoupled>(a, g[i], w[i], m[i], v[i]);
}

template <typename TG, typename TP>
void adam_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const AdamStep a = adam_step(c, k);
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    float* w = s.master + base;
    float* m = s.state[0] + base;
    float* v = s.state[1] + base;
    if (a.decoupled) {
      adam_block<true>(a, g, w, m, v, len);
    } else {
      adam_block<false>(a, g, w, m, v, len);
    }
    store_params<TP>(s, base, len);
  });
}

void sgd_block(const SgdStep st, const float* __restrict g, float* __restrict w, float* __restrict buf,
               size_t n) {
  for (size_t i = 0; i < n; ++i) sgd_update(st, g[i], w[i], buf == nullptr ? nullptr : buf + i);
}

template <typename TG, typename TP>
void sgd_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const SgdStep st = sgd_step(c, k);
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    sgd_block(st, g, s.master + base, s.state[0] == nullptr ? nullptr : s.state[0] + base, len);
    store_params<TP>(s, base, len);
  });
}

template <typename TG, typename TP>
void step_typed(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  if (c.kind == OptimizerKind::kSgd) {
    sgd_loop<TG, TP>(c, s, k);
  } else {
    adam_loop<TG, TP>(c, s, k);
  }
}

}  // namespace

void optimizer_step_host(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  visit_shard_types(c, s, [&](auto grad_type, auto param_type) {
    step_typed<typename decltype(grad_type)::type, typename decltype(param_type)::type>(c, s, k);
  });
}

}  // namespace zest::detail
