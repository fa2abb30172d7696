// fp16 and bf16 arrays to and from float in vector instructions where the
// compiler's loops over core/float16.h fall short, for the host loops of
// optim/ and comm/: fp16 with F16C's instructions (VCVTPH2PS and
// VCVTPS2PH), which GCC does not turn the integer conversions into (the
// portable fp16 loops take 5-25x their time), and bf16's rounding on AVX2
// (core/detail/bf16_avx2.h; GCC's loop takes about twice as long).
//
// F16C's give core/float16.h's bits: both round to nearest even, are exact
// for subnormals, and quiet a NaN keeping its sign and top payload bits; the
// immediate 0 asks for round-to-nearest-even whatever MXCSR says.
// test_float16_arrays compares each with core/float16.h over every fp16 and
// a sweep of float bit patterns.
#pragma once

#include <cstddef>

#include "zest/core/float16.h"

namespace zest::detail {

// Whether the host loops convert fp16 with F16C: on every CPU with AVX2
// (cpu_supports checks cpuid for F16C with it), unless ZEST_NO_F16C is set
// (non-empty, not "0"), which selects the portable loops, for tests and for
// comparing the two.
bool use_f16c();

// Only where use_f16c() holds. Ragged tails go through core/float16.h.
void widen_f16c(const fp16* in, float* out, size_t n);
void narrow_f16c(const float* in, fp16* out, size_t n);

// On CPUs with AVX2 only (cpu_supports(CpuIsa::kAvx2)).
void narrow_bf16_avx2(const float* in, bf16* out, size_t n);

}  // namespace zest::detail
