// fp16 arrays to and from float with F16C's instructions (VCVTPH2PS and
// VCVTPS2PH), for the host loops of optim/ and comm/. GCC does not turn
// core/float16.h's integer conversions into them: the portable fp16 loops
// take 5-25x the time of these.
//
// They give core/float16.h's bits: both round to nearest even, are exact for
// subnormals, and quiet a NaN keeping its sign and top payload bits; the
// immediate 0 asks for round-to-nearest-even whatever MXCSR says.
// test_optimizer_bits and test_host_reduce compare the two on every bit
// pattern.
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

}  // namespace zest::detail
