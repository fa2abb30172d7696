#include "zest/comm/host_reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

#include "zest/comm/reduce_element.h"
#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"

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
  // Two inputs into one output (a two-rank reduce-scatter, the common
  // case): one pass, without the block of accumulators, the same operations
  // on each element in the same order. (AVX-512: bf16 35-40% faster.)
  // The output may be one of the inputs (a reduction in place), never
  // partly over one: element i is read before it is written, and no
  // iteration reads another's, which ivdep tells the vectorizer.
  if (a.num_inputs == 2 && a.num_outputs == 1) {
    const T* in0 = static_cast<const T*>(a.inputs[0]);
    const T* in1 = static_cast<const T*>(a.inputs[1]);
    T* out = static_cast<T*>(a.outputs[0]);
#pragma GCC ivdep
    for (size_t i = 0; i < a.count; ++i) {
      A acc = combine(reduction::load(in0[i]), reduction::load(in1[i]));
      if constexpr (kOp == ReduceOp::kAvg && std::is_floating_point_v<A>) acc /= static_cast<A>(2);
      out[i] = static_cast<T>(acc);
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
    for (int j = 1; j < a.num_outputs; ++j) {
      T* out = static_cast<T*>(a.outputs[j]) + base;
      if (out != out0) std::memcpy(out, out0, len * sizeof(T));
    }
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
#endif

}  // namespace

void host_reduce(const void* const* inputs, int num_inputs, void* const* outputs, int num_outputs,
                 size_t count, DType dtype, ReduceOp op) {
  ZEST_INTERNAL_ASSERT(num_inputs >= 1 && num_outputs >= 1);
  ZEST_CHECK(op != ReduceOp::kAvg || is_floating(dtype), "avg of {} is not defined", dtype_name(dtype));
  const Args a{inputs, num_inputs, outputs, num_outputs, count};
#if ZEST_X86_DISPATCH
  switch (host_isa()) {
    case CpuIsa::kAvx512: return reduce_avx512(a, dtype, op);
    case CpuIsa::kAvx2: return reduce_avx2(a, dtype, op);
    case CpuIsa::kBaseline: break;
  }
#endif
  reduce_baseline(a, dtype, op);
}

}  // namespace zest
