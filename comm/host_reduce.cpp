#include "zest/comm/host_reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "zest/comm/detail/reduce_element.h"
#include "zest/core/detail/bf16_avx2.h"
#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"
#include "zest/core/float16_arrays.h"

#if ZEST_X86_DISPATCH
#include <immintrin.h>
#endif

namespace zest {
namespace {

// Elements per block: its accumulator (4 or 8 bytes an element) and one
// block of each input stay in L1 while the inputs are added in.
constexpr size_t kBlock = 2048;

struct Args {
  const void* const* inputs;
  int num_inputs;
  void* const* outputs;
  int num_outputs;
  size_t count;
};

// Output 0's elements [base, base + len) copied to the other outputs (the
// in-process all-reduce writes every rank's), once the block's inputs are
// read: an output that is an input may then be written.
template <typename T>
void copy_to_other_outputs(const Args& a, size_t base, size_t len) {
  const T* out0 = static_cast<const T*>(a.outputs[0]) + base;
  for (int j = 1; j < a.num_outputs; ++j) {
    T* out = static_cast<T*>(a.outputs[j]) + base;
    if (out != out0) std::memcpy(out, out0, len * sizeof(T));
  }
}

// The per-element operations are reduction::'s, in the order of one element
// at a time: acc = in0; acc = op(acc, in1); ... ; acc /= n for kAvg; store.
// Only the loop nest changes (the rank loop outside a block), so the bits are
// those of the element loop, and of the CUDA kernel sharing reduction::.
// always_inline: inlined into each instruction set's entry point below, whose
// target attribute the vectorizer then uses (Note [ISA dispatch]).
template <typename T, ReduceOp kOp>
[[gnu::always_inline]] inline void reduce_typed(const Args& a) {
  using A = typename reduction::Acc<T>::type;
  const auto combine = [](A acc, A x) {
    return kOp == ReduceOp::kMax ? reduction::max<T>(acc, x) : reduction::add<T>(acc, x);
  };
  // Two inputs (a two-rank reduce-scatter or all-reduce, the common case):
  // one pass into the first output, without the block of accumulators, the
  // same operations on each element in the same order (AVX-512: bf16 35-40%
  // faster), by blocks, each copied to the other outputs (an in-process
  // all-reduce writes every rank's) once its inputs are read. An output may
  // be one of the inputs (a reduction in place), never partly over one:
  // element i is read before it is written, and no iteration reads
  // another's, which ivdep tells the vectorizer.
  if (a.num_inputs == 2) {
    for (size_t base = 0; base < a.count; base += kBlock) {
      const size_t len = a.count - base < kBlock ? a.count - base : kBlock;
      const T* in0 = static_cast<const T*>(a.inputs[0]) + base;
      const T* in1 = static_cast<const T*>(a.inputs[1]) + base;
      T* out0 = static_cast<T*>(a.outputs[0]) + base;
#pragma GCC ivdep
      for (size_t i = 0; i < len; ++i) {
        A acc = combine(reduction::load(in0[i]), reduction::load(in1[i]));
        if constexpr (kOp == ReduceOp::kAvg && std::is_floating_point_v<A>) acc /= static_cast<A>(2);
        out0[i] = static_cast<T>(acc);
      }
      copy_to_other_outputs<T>(a, base, len);
    }
    return;
  }
  A acc[kBlock];
  for (size_t base = 0; base < a.count; base += kBlock) {
    const size_t len = a.count - base < kBlock ? a.count - base : kBlock;
    const T* __restrict in0 = static_cast<const T*>(a.inputs[0]) + base;
    if (a.num_inputs == 1) {
      for (size_t i = 0; i < len; ++i) acc[i] = reduction::load(in0[i]);
    } else {
      const T* __restrict in1 = static_cast<const T*>(a.inputs[1]) + base;
      for (size_t i = 0; i < len; ++i) acc[i] = combine(reduction::load(in0[i]), reduction::load(in1[i]));
    }
    for (int k = 2; k < a.num_inputs; ++k) {
      const T* __restrict in = static_cast<const T*>(a.inputs[k]) + base;
      for (size_t i = 0; i < len; ++i) acc[i] = combine(acc[i], reduction::load(in[i]));
    }
    if constexpr (kOp == ReduceOp::kAvg && std::is_floating_point_v<A>) {
      const A n = static_cast<A>(a.num_inputs);
      for (size_t i = 0; i < len; ++i) acc[i] /= n;
    }
    // Every input of the block is read: the outputs, which may be inputs,
    // can be written. Modular for integers (C++20), rounding for fp16/bf16.
    T* __restrict out0 = static_cast<T*>(a.outputs[0]) + base;
    for (size_t i = 0; i < len; ++i) out0[i] = static_cast<T>(acc[i]);
    copy_to_other_outputs<T>(a, base, len);
  }
}

template <typename T>
[[gnu::always_inline]] inline void reduce_op(const Args& a, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return reduce_typed<T, ReduceOp::kSum>(a);
    case ReduceOp::kAvg: return reduce_typed<T, ReduceOp::kAvg>(a);
    case ReduceOp::kMax: return reduce_typed<T, ReduceOp::kMax>(a);
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled reduce op {}", static_cast<int>(op));
}

[[gnu::always_inline]] inline void reduce_any(const Args& a, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kFloat32: return reduce_op<float>(a, op);
    case DType::kFloat16: return reduce_op<fp16>(a, op);
    case DType::kBFloat16: return reduce_op<bf16>(a, op);
    case DType::kInt32: return reduce_op<int32_t>(a, op);
    case DType::kInt64: return reduce_op<int64_t>(a, op);
    case DType::kUInt8: return reduce_op<uint8_t>(a, op);
  }
  ZEST_INTERNAL_ASSERT(false, "unhandled dtype {}", dtype_name(dtype));
}

void reduce_baseline(const Args& a, DType dtype, ReduceOp op) { reduce_any(a, dtype, op); }
#if ZEST_X86_DISPATCH
ZEST_TARGET_AVX2 void reduce_avx2(const Args& a, DType dtype, ReduceOp op) { reduce_any(a, dtype, op); }
ZEST_TARGET_AVX512 void reduce_avx512(const Args& a, DType dtype, ReduceOp op) { reduce_any(a, dtype, op); }

// Note [16-bit reductions in vector registers]: GCC vectorizes the loops
// above for fp32 and the integers at about the time a copy of their bytes
// takes, but not core/float16.h's fp16 conversions (a two-input fp16 sum
// took 24-31x that copy on AVX2 and AVX-512), and its bf16 rounding on AVX2
// took 1.7-2.4x. So fp16 goes through F16C's instructions
// (core/float16_arrays.h, the same bits; not under ZEST_CPU_ISA=baseline,
// which keeps the portable loops for tests), and two-input bf16 on AVX2
// through float_to_bf16_bits written in AVX2 instructions
// (core/detail/bf16_avx2.h). Each element sees the same operations in the same
// order as in reduce_typed (widen exactly, add or combine in float in rank
// order, / n for avg, one rounding), so the bits do not change;
// test_host_reduce checks every bit pattern on every path. bf16 with more
// inputs (or max) keeps reduce_typed's loop: widening each input into a
// block first and narrowing with these instructions took 1.4-1.8x its time
// (three inputs, 4M elements), since the loop adds each input as it widens.

// out = in0 + in1 (/ 2 for avg) for bf16 on AVX2, 16 elements at a time. The
// output may be either input (each group is read before it is written).
// Unpacking 16 bf16 with zeros widens them exactly (the bits in a float's
// top half) into two vectors that hold, per 128-bit lane, the lane's first
// and last four; packing the rounded results puts them back in order.
ZEST_TARGET_AVX2 void two_bf16(const bf16* in0, const bf16* in1, bf16* out, size_t n, bool avg) {
  const __m256i zero = _mm256_setzero_si256();
  const __m256 two = _mm256_set1_ps(2.0f);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in0 + i));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in1 + i));
    __m256 lo = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, a)),
                              _mm256_castsi256_ps(_mm256_unpacklo_epi16(zero, b)));
    __m256 hi = _mm256_add_ps(_mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, a)),
                              _mm256_castsi256_ps(_mm256_unpackhi_epi16(zero, b)));
    if (avg) {
      lo = _mm256_div_ps(lo, two);
      hi = _mm256_div_ps(hi, two);
    }
    // lo and hi hold, per 128-bit lane, that lane's first and last four:
    // packus (within lanes) puts them back in order.
    const __m256i packed = _mm256_packus_epi32(_mm256_srli_epi32(detail::round_bf16x8(lo), 16),
                                               _mm256_srli_epi32(detail::round_bf16x8(hi), 16));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), packed);
  }
  for (; i < n; ++i) {
    float acc = reduction::add<bf16>(reduction::load(in0[i]), reduction::load(in1[i]));
    if (avg) acc /= 2.0f;
    out[i] = bf16(acc);
  }
}

// The same for fp16 with F16C, 8 elements at a time.
ZEST_TARGET_AVX2 void two_fp16(const fp16* in0, const fp16* in1, fp16* out, size_t n, bool avg) {
  const __m256 two = _mm256_set1_ps(2.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in0 + i)));
    const __m256 b = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in1 + i)));
    __m256 sum = _mm256_add_ps(a, b);
    if (avg) sum = _mm256_div_ps(sum, two);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i), _mm256_cvtps_ph(sum, 0));
  }
  for (; i < n; ++i) {
    float acc = reduction::add<fp16>(reduction::load(in0[i]), reduction::load(in1[i]));
    if (avg) acc /= 2.0f;
    out[i] = fp16(acc);
  }
}

// fp16, any inputs, outputs and op: reduce_typed's blocks, each input
// widened with F16C into a float block first and the result narrowed with it.
template <ReduceOp kOp>
ZEST_TARGET_AVX2 void fp16_blocks(const Args& a) {
  float acc[kBlock];
  float x[kBlock];
  for (size_t base = 0; base < a.count; base += kBlock) {
    const size_t len = a.count - base < kBlock ? a.count - base : kBlock;
    detail::widen_f16c(static_cast<const fp16*>(a.inputs[0]) + base, acc, len);
    for (int k = 1; k < a.num_inputs; ++k) {
      detail::widen_f16c(static_cast<const fp16*>(a.inputs[k]) + base, x, len);
      for (size_t i = 0; i < len; ++i) {
        acc[i] = kOp == ReduceOp::kMax ? reduction::max<fp16>(acc[i], x[i]) : reduction::add<fp16>(acc[i], x[i]);
      }
    }
    if constexpr (kOp == ReduceOp::kAvg) {
      const auto n = static_cast<float>(a.num_inputs);
      for (size_t i = 0; i < len; ++i) acc[i] /= n;
    }
    // Every input of the block is read: the outputs, which may be inputs,
    // can be written.
    fp16* out0 = static_cast<fp16*>(a.outputs[0]) + base;
    detail::narrow_f16c(acc, out0, len);
    copy_to_other_outputs<fp16>(a, base, len);
  }
}

// Two inputs, by blocks into the first output and copied to the others, as
// reduce_typed's two-input loop does.
template <typename T, typename Two>
void two_by_blocks(const Args& a, bool avg, Two two) {
  for (size_t base = 0; base < a.count; base += kBlock) {
    const size_t len = a.count - base < kBlock ? a.count - base : kBlock;
    T* out0 = static_cast<T*>(a.outputs[0]) + base;
    two(static_cast<const T*>(a.inputs[0]) + base, static_cast<const T*>(a.inputs[1]) + base, out0, len, avg);
    copy_to_other_outputs<T>(a, base, len);
  }
}

// Note [16-bit reductions in vector registers]: whether `a` was reduced
// here (fp16 where F16C is used, two-input bf16 sums and averages on AVX2).
bool reduce_16bit(const Args& a, DType dtype, ReduceOp op, CpuIsa isa) {
  const bool two = a.num_inputs == 2 && op != ReduceOp::kMax;
  const bool avg = op == ReduceOp::kAvg;
  if (dtype == DType::kFloat16 && detail::use_f16c()) {
    if (two) {
      two_by_blocks<fp16>(a, avg, two_fp16);
      return true;
    }
    switch (op) {
      case ReduceOp::kSum: fp16_blocks<ReduceOp::kSum>(a); return true;
      case ReduceOp::kAvg: fp16_blocks<ReduceOp::kAvg>(a); return true;
      case ReduceOp::kMax: fp16_blocks<ReduceOp::kMax>(a); return true;
    }
  }
  if (dtype == DType::kBFloat16 && isa == CpuIsa::kAvx2 && two) {
    two_by_blocks<bf16>(a, avg, two_bf16);
    return true;
  }
  return false;
}
#endif

}  // namespace

void host_reduce(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
                 size_t count, DType dtype, ReduceOp op) {
  ZEST_INTERNAL_ASSERT(num_inputs >= 1 && num_outputs >= 1);
  ZEST_CHECK(op != ReduceOp::kAvg || is_floating(dtype), "avg of {} is not defined", dtype_name(dtype));
  const Args a{inputs, num_inputs, outputs, num_outputs, count};
#if ZEST_X86_DISPATCH
  const CpuIsa isa = host_isa();
  if (isa != CpuIsa::kBaseline && reduce_16bit(a, dtype, op, isa)) return;
  switch (isa) {
    case CpuIsa::kAvx512: return reduce_avx512(a, dtype, op);
    case CpuIsa::kAvx2: return reduce_avx2(a, dtype, op);
    case CpuIsa::kBaseline: break;
  }
#endif
  reduce_baseline(a, dtype, op);
}

}  // namespace zest
