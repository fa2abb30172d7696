// fp16 and bf16 conversions against independent references, over every 16-bit
// pattern and every rounding boundary between adjacent 16-bit values.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <limits>

#include "zest/core/float16.h"

namespace {

using zest::bf16_bits_to_float;
using zest::detail::bits_float;
using zest::detail::float_bits;
using zest::float_to_bf16_bits;
using zest::float_to_fp16_bits;
using zest::fp16_bits_to_float;

// The value of an fp16 pattern computed from the definition of binary16.
double fp16_reference(uint16_t h) {
  const int sign = (h >> 15) ? -1 : 1;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) return mantissa ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

// float -> fp16 by scaling in double and rounding with nearbyint (the default
// rounding mode is to nearest even); independent of the bit manipulation
// under test. Not for NaN.
uint16_t fp16_reference_from_float(float f) {
  const double a = std::fabs(static_cast<double>(f));
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (a >= 65520.0) return sign | 0x7c00;
  if (a < std::ldexp(1.0, -14)) {  // subnormal range: multiples of 2^-24
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(std::nearbyint(std::ldexp(a, 24))));
  }
  int e2 = 0;
  (void)std::frexp(a, &e2);  // a = m * 2^e2, m in [0.5, 1)
  int e = e2 - 1;
  double q = std::nearbyint(std::ldexp(a, 10 - e));  // 11 significant bits
  if (q == 2048.0) {
    q = 1024.0;
    ++e;
  }
  return static_cast<uint16_t>(sign | ((e + 15) << 10) | (static_cast<int>(q) - 1024));
}

bool is_nan16(uint16_t h, int exp_bits) {
  const uint16_t exp_mask = static_cast<uint16_t>(((1u << exp_bits) - 1u) << (15 - exp_bits));
  const uint16_t man_mask = static_cast<uint16_t>((1u << (15 - exp_bits)) - 1u);
  return (h & exp_mask) == exp_mask && (h & man_mask) != 0;
}

// Checks float->16-bit rounding at and around the midpoint of every pair of
// adjacent finite positive values a < b (negative values mirror them).
template <typename ToBits, typename ToFloat>
void check_rounding_boundaries(ToBits to_bits, ToFloat to_float, uint16_t max_finite) {
  for (uint32_t a = 0; a < max_finite; ++a) {
    const uint16_t ua = static_cast<uint16_t>(a);
    const uint16_t ub = static_cast<uint16_t>(a + 1);
    const float fa = to_float(ua);
    const float fb = to_float(ub);
    // The midpoint of two adjacent 16-bit values needs one more significand
    // bit than they have, so it is exact in float.
    const float mid = static_cast<float>((static_cast<double>(fa) + fb) / 2);
    REQUIRE(static_cast<double>(mid) == (static_cast<double>(fa) + fb) / 2);
    const uint16_t even = (ua & 1u) == 0 ? ua : ub;
    CHECK(to_bits(fa) == ua);
    CHECK(to_bits(-fa) == static_cast<uint16_t>(ua | 0x8000u));
    CHECK(to_bits(mid) == even);
    CHECK(to_bits(-mid) == static_cast<uint16_t>(even | 0x8000u));
    CHECK(to_bits(std::nextafter(mid, 0.0f)) == ua);
    CHECK(to_bits(std::nextafter(mid, INFINITY)) == ub);
  }
}

}  // namespace

TEST_CASE("fp16 to float is exact for all 65536 patterns") {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = fp16_bits_to_float(h);
    const double ref = fp16_reference(h);
    if (std::isnan(ref)) {
      REQUIRE(std::isnan(f));
      // Sign and payload kept: the payload lands in the top mantissa bits.
      CHECK((float_bits(f) >> 31) == (h >> 15));
      CHECK(((float_bits(f) >> 13) & 0x3ffu) == (h & 0x3ffu));
    } else {
      REQUIRE(static_cast<double>(f) == ref);
      CHECK(std::signbit(f) == ((h >> 15) != 0));  // -0 stays -0
    }
  }
}

TEST_CASE("fp16 round trip is the identity and NaNs stay NaN with sign, quieted") {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const uint16_t back = float_to_fp16_bits(fp16_bits_to_float(h));
    if (is_nan16(h, 5)) {
      CHECK(back == static_cast<uint16_t>(h | 0x0200u));
    } else {
      REQUIRE(back == h);
    }
  }
}

TEST_CASE("float to fp16 rounds to nearest even at every boundary") {
  check_rounding_boundaries(float_to_fp16_bits, fp16_bits_to_float, 0x7bffu);
}

TEST_CASE("float to fp16: overflow, underflow, Inf and NaN") {
  CHECK(float_to_fp16_bits(65504.0f) == 0x7bff);
  CHECK(float_to_fp16_bits(std::nextafter(65520.0f, 0.0f)) == 0x7bff);
  CHECK(float_to_fp16_bits(65520.0f) == 0x7c00);  // halfway to the next power: ties to Inf
  CHECK(float_to_fp16_bits(1e10f) == 0x7c00);
  CHECK(float_to_fp16_bits(-1e10f) == 0xfc00);
  CHECK(float_to_fp16_bits(INFINITY) == 0x7c00);
  CHECK(float_to_fp16_bits(-INFINITY) == 0xfc00);
  CHECK(float_to_fp16_bits(std::ldexp(1.0f, -25)) == 0x0000);  // tie to even: zero
  CHECK(float_to_fp16_bits(std::nextafter(std::ldexp(1.0f, -25), 1.0f)) == 0x0001);
  CHECK(float_to_fp16_bits(std::ldexp(3.0f, -26)) == 0x0001);
  CHECK(float_to_fp16_bits(std::numeric_limits<float>::denorm_min()) == 0x0000);
  CHECK(float_to_fp16_bits(-std::numeric_limits<float>::denorm_min()) == 0x8000);
  CHECK(float_to_fp16_bits(-0.0f) == 0x8000);
  CHECK(is_nan16(float_to_fp16_bits(std::numeric_limits<float>::quiet_NaN()), 5));
  CHECK(is_nan16(float_to_fp16_bits(std::numeric_limits<float>::signaling_NaN()), 5));
  CHECK(float_to_fp16_bits(bits_float(0xffc00001u)) == 0xfe00);  // sign kept, quiet
  CHECK(float_to_fp16_bits(bits_float(0x7f802000u)) == 0x7e01);  // payload's top bits kept
}

TEST_CASE("float to fp16 agrees with a double-precision reference on a sweep of all floats") {
  // Every 251st bit pattern (prime, so all mantissa bit positions vary):
  // 17 million floats of every exponent. Where the compiler has _Float16 its
  // conversion is a second, independent reference.
  for (uint64_t u = 0; u <= 0xffffffffu; u += 251) {
    const float f = bits_float(static_cast<uint32_t>(u));
    const uint16_t ours = float_to_fp16_bits(f);
    if (std::isnan(f)) {
      REQUIRE(is_nan16(ours, 5));
      continue;
    }
    const uint16_t ref = fp16_reference_from_float(f);
    if (ours != ref) FAIL("float bits " << std::hex << u << ": ours " << ours << ", reference " << ref);
#if defined(__FLT16_MAX__) && !defined(__clang__)
    const _Float16 h = static_cast<_Float16>(f);
    uint16_t compiler_bits;
    std::memcpy(&compiler_bits, &h, sizeof(compiler_bits));
    if (ours != compiler_bits) FAIL("float bits " << std::hex << u << ": ours " << ours << ", compiler " << compiler_bits);
#endif
  }
}

TEST_CASE("bf16 to float and back is the identity for all 65536 patterns") {
  for (uint32_t i = 0; i <= 0xffff; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = bf16_bits_to_float(b);
    REQUIRE(float_bits(f) == (i << 16));  // bf16 is the top half of a float
    const uint16_t back = float_to_bf16_bits(f);
    if (is_nan16(b, 8)) {
      CHECK(back == static_cast<uint16_t>(b | 0x0040u));
    } else {
      REQUIRE(back == b);
    }
  }
}

TEST_CASE("float to bf16 rounds to nearest even at every boundary") {
  check_rounding_boundaries(float_to_bf16_bits, bf16_bits_to_float, 0x7f7fu);
}

TEST_CASE("float to bf16: overflow, Inf and NaN") {
  CHECK(float_to_bf16_bits(bits_float(0x7f7fffffu)) == 0x7f80);  // FLT_MAX rounds to Inf
  CHECK(float_to_bf16_bits(bits_float(0x7f7f7fffu)) == 0x7f7f);
  CHECK(float_to_bf16_bits(INFINITY) == 0x7f80);
  CHECK(float_to_bf16_bits(-INFINITY) == 0xff80);
  CHECK(float_to_bf16_bits(bits_float(0x7f800001u)) == 0x7fc0);  // NaN with low payload stays NaN
  CHECK(float_to_bf16_bits(bits_float(0xffa00000u)) == 0xffe0);
  CHECK(float_to_bf16_bits(-0.0f) == 0x8000);
}

TEST_CASE("fp16 and bf16 storage types convert through float") {
  CHECK(static_cast<float>(zest::fp16(1.5f)) == 1.5f);
  CHECK(static_cast<float>(zest::bf16(-2.25f)) == -2.25f);
  CHECK(zest::fp16(0.1f).bits == 0x2e66);
  CHECK(zest::bf16(0.1f).bits == 0x3dcd);
  CHECK(zest::fp16::from_bits(0x3c00).bits == 0x3c00);
}
