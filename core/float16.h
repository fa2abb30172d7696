// The two 16-bit floating-point storage types, fp16 (IEEE binary16) and bf16
// (bfloat16), with exact conversions to and from float that compile for host
// and device alike.
//
// Conversions round to nearest, ties to even, as the hardware does, so a value
// converted on the host and on the GPU has the same bits. NaN stays NaN (its
// sign and the top payload bits are kept and the quiet bit is set) and Inf
// stays Inf. They are integer arithmetic but for two float operations in
// fp16's subnormal range, each exact or rounded to nearest even: flush-to-zero
// flags change no result (and, as for every float operation in ZEST, the
// rounding mode is assumed to be the default).
// Arithmetic happens in float: these types are storage, not numbers.
#pragma once

#include <cstdint>
#include <cstring>

#include "zest/core/platform.h"

namespace zest {

namespace detail {

ZEST_HOST_DEVICE inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

ZEST_HOST_DEVICE inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

}  // namespace detail

// float -> fp16 bits, round to nearest even.
//
// Every case's result is computed and one selected, with no early return: a
// branch-free body lets the host's conversion loops vectorize.
ZEST_HOST_DEVICE inline uint16_t float_to_fp16_bits(float value) {
  const uint32_t x = detail::float_bits(value);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  // NaN: quiet it, keep the top 9 payload bits.
  const uint32_t nan = 0x7e00u | ((abs >> 13) & 0x03ffu);
  // >= 2^-14, normal fp16 (or rounds up to Inf): rebias the exponent and
  // round away the low 13 bits; a carry out of the mantissa correctly bumps
  // the exponent, up to Inf at 65520.
  const uint32_t rebased = abs - ((127u - 15u) << 23);
  const uint32_t normal = (rebased + 0x0fffu + ((rebased >> 13) & 1u)) >> 13;
  // < 2^-14, subnormal fp16 (a multiple of 2^-24) or zero: abs * 2^24 < 1024
  // is exact, and adding 2^23, where the float spacing is 1, rounds it to the
  // nearest integer, ties to even, which is the encoding (1024 carries into
  // the smallest normal, correctly). Inputs that flush to zero round to zero
  // anyway.
  const float scaled = detail::bits_float(abs) * 16777216.0f;
  const uint32_t subnormal = detail::float_bits(scaled + 8388608.0f) - 0x4b000000u;
  const uint32_t h = abs > 0x7f800000u   ? nan
                     : abs >= 0x47800000u ? 0x7c00u  // >= 65536 or Inf: past every rounding to 65504
                     : abs >= 0x38800000u ? normal
                                          : subnormal;
  return static_cast<uint16_t>(sign | h);
}

// fp16 bits -> float, exact. Branch-free like the above.
ZEST_HOST_DEVICE inline float fp16_bits_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x03ffu;
  const uint32_t inf_nan = 0x7f800000u | (mantissa << 13);
  const uint32_t normal = ((exponent + 112u) << 23) | (mantissa << 13);
  // Subnormal or zero: mantissa * 2^-24, an exact product that is a normal float.
  const uint32_t subnormal =
      detail::float_bits(static_cast<float>(static_cast<int32_t>(mantissa)) * 5.9604644775390625e-8f);
  const uint32_t magnitude = exponent == 0x1fu ? inf_nan : exponent != 0 ? normal : subnormal;
  return detail::bits_float(sign | magnitude);
}

// float -> bf16 bits, round to nearest even.
// Both results are computed and one selected, rather than returning early for
// NaN: a branch-free body lets the host's conversion loops vectorize.
ZEST_HOST_DEVICE inline uint16_t float_to_bf16_bits(float value) {
  const uint32_t x = detail::float_bits(value);
  const uint32_t odd = (x >> 16) & 1u;
  const auto rounded = static_cast<uint16_t>((x + 0x7fffu + odd) >> 16);
  const auto quiet_nan = static_cast<uint16_t>((x >> 16) | 0x0040u);
  return (x & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded;
}

// bf16 bits -> float, exact.
ZEST_HOST_DEVICE inline float bf16_bits_to_float(uint16_t b) {
  return detail::bits_float(static_cast<uint32_t>(b) << 16);
}

// Storage types. Layout is exactly the 16 bits, so arrays of them can be
// handed to CUDA kernels as __half / __nv_bfloat16 and to NCCL as ncclHalf /
// ncclBfloat16.
struct fp16 {
  uint16_t bits = 0;
  fp16() = default;
  ZEST_HOST_DEVICE explicit fp16(float f) : bits(float_to_fp16_bits(f)) {}
  ZEST_HOST_DEVICE static fp16 from_bits(uint16_t b) {
    fp16 h;
    h.bits = b;
    return h;
  }
  ZEST_HOST_DEVICE explicit operator float() const { return fp16_bits_to_float(bits); }
};

struct bf16 {
  uint16_t bits = 0;
  bf16() = default;
  ZEST_HOST_DEVICE explicit bf16(float f) : bits(float_to_bf16_bits(f)) {}
  ZEST_HOST_DEVICE static bf16 from_bits(uint16_t b) {
    bf16 h;
    h.bits = b;
    return h;
  }
  ZEST_HOST_DEVICE explicit operator float() const { return bf16_bits_to_float(bits); }
};

static_assert(sizeof(fp16) == 2 && sizeof(bf16) == 2);

}  // namespace zest
