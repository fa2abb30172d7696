// The two 16-bit floating-point storage types, fp16 (IEEE binary16) and bf16
// (bfloat16), with exact conversions to and from float that compile for host
// and device alike.
//
// Conversions round to nearest, ties to even, as the hardware does, so a value
// converted on the host and on the GPU has the same bits. NaN stays NaN (its
// sign and the top payload bits are kept and the quiet bit is set) and Inf
// stays Inf. They are written with integer arithmetic only, so neither the
// floating-point environment nor flush-to-zero flags change their results.
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
ZEST_HOST_DEVICE inline uint16_t float_to_fp16_bits(float value) {
  const uint32_t x = detail::float_bits(value);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) {  // NaN: quiet it, keep the top 9 payload bits
    return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x03ffu));
  }
  if (abs >= 0x47800000u) {  // >= 65536 (or Inf): beyond every rounding to 65504
    return static_cast<uint16_t>(sign | 0x7c00u);
  }
  if (abs >= 0x38800000u) {  // >= 2^-14: normal fp16 (or rounds up to Inf)
    // Rebias the exponent and round away the low 13 bits; a carry out of the
    // mantissa correctly bumps the exponent, up to Inf at 65520.
    const uint32_t rebased = abs - ((127u - 15u) << 23);
    const uint32_t odd = (rebased >> 13) & 1u;
    return static_cast<uint16_t>(sign | ((rebased + 0x0fffu + odd) >> 13));
  }
  // Subnormal fp16 (a multiple of 2^-24) or zero.
  const uint32_t exponent = abs >> 23;
  if (exponent < 102u) {  // < 2^-25: rounds to zero (float subnormals too)
    return sign;
  }
  const uint32_t mantissa = (abs & 0x007fffffu) | 0x00800000u;
  const uint32_t shift = 126u - exponent;  // 14..24
  uint32_t q = mantissa >> shift;
  const uint32_t rem = mantissa & ((1u << shift) - 1u);
  const uint32_t halfway = 1u << (shift - 1u);
  if (rem > halfway || (rem == halfway && (q & 1u))) {
    ++q;  // may carry into the smallest normal, which is the right encoding
  }
  return static_cast<uint16_t>(sign | q);
}

// fp16 bits -> float, exact.
ZEST_HOST_DEVICE inline float fp16_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x03ffu;
  if (exponent == 0x1fu) {
    return detail::bits_float(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return detail::bits_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  }
  if (mantissa == 0) {
    return detail::bits_float(sign);
  }
  uint32_t e = 113u;  // normalize the subnormal: value = mantissa * 2^-24
  while ((mantissa & 0x0400u) == 0) {
    mantissa <<= 1;
    --e;
  }
  return detail::bits_float(sign | (e << 23) | ((mantissa & 0x03ffu) << 13));
}

// float -> bf16 bits, round to nearest even.
ZEST_HOST_DEVICE inline uint16_t float_to_bf16_bits(float value) {
  const uint32_t x = detail::float_bits(value);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  const uint32_t odd = (x >> 16) & 1u;
  return static_cast<uint16_t>((x + 0x7fffu + odd) >> 16);
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
