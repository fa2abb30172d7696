// Internal to optim/: the host optimizer's inner loops over one block of
// floats, and the fp16/bf16 conversions, compiled once per instruction set
// (Note [ISA dispatch] in core/cpu_isa.h) and picked at run time. Every
// table computes the same bits: the same per-element functions
// (optimizer_impl.h, core/float16.h), only wider vectors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "zest/core/cpu_isa.h"
#include "zest/core/float16.h"
#include "zest/optim/chunk_sum_order.h"
#include "zest/optim/detail/optimizer_impl.h"

namespace zest::detail {

// Arrays passed to one entry never overlap (except that the gradient block
// is read-only and may be any memory).
struct HostKernels {
  CpuIsa isa = CpuIsa::kBaseline;
  void (*adamw)(AdamStep a, const float* g, float* w, float* m, float* v, size_t n) = nullptr;
  void (*adam_l2)(AdamStep a, const float* g, float* w, float* m, float* v, size_t n) = nullptr;
  // `buf` null: SGD without momentum.
  void (*sgd)(SgdStep s, const float* g, float* w, float* buf, size_t n) = nullptr;
  void (*widen_fp16)(const fp16* in, float* out, size_t n) = nullptr;
  void (*narrow_fp16)(const float* in, fp16* out, size_t n) = nullptr;
  void (*widen_bf16)(const bf16* in, float* out, size_t n) = nullptr;
  void (*narrow_bf16)(const float* in, bf16* out, size_t n) = nullptr;
  // The sums of squares of x * scale over chunks of `chunk` elements (the
  // last may be shorter), each in the GPU's order (chunk_sum_order.h).
  void (*chunk_squares)(const float* x, size_t n, size_t chunk, float scale, double* out) = nullptr;
  // The same of bf16 elements, each widened exactly.
  void (*chunk_squares_bf16)(const bf16* x, size_t n, size_t chunk, float scale, double* out) = nullptr;
  // Whether any of n IEEE values is a NaN or an Inf: 16-bit ones (fp16 or
  // bf16, told apart by their exponent mask) or fp32.
  bool (*any_non_finite16)(const uint16_t* bits, size_t n, uint16_t exponent) = nullptr;
  bool (*any_non_finite32)(const uint32_t* bits, size_t n) = nullptr;
};

// The table for host_isa(); its fp16 conversions use F16C's instructions
// where the CPU has them, unless ZEST_NO_F16C is set (non-empty, not "0").
const HostKernels& host_kernels();

}  // namespace zest::detail
