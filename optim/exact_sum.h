// An exact sum of non-negative doubles in fixed point, for a gradient norm
// whose bits do not depend on how many ranks add which parts, nor in which
// order. Compiled for the host and the GPU, so both add the same way.
//
// Note: the range argument. What is summed are the gradient-norm chunk sums
// (optim/grad_norm.h): double sums of 32 finite float lane sums, or, where
// those would not do (Note [float lanes, double fallback]), double sums of
// squares x*x of finite floats x.
//   - Every finite float is a multiple of 2^-149 (the smallest subnormal), so
//     every square is a multiple of 2^-298 and exact in double (at most 48
//     significant bits). A double sum of such values, rounded at every step,
//     stays a multiple of 2^-298: rounding to 53 bits only clears low bits.
//     A float lane sum is a float, so a multiple of 2^-149, and so is the
//     double sum of 32 of them.
//   - |x| < 2^128, so a square is < 2^256, a chunk of 256 squares sums to
//     less than 2^264 (32 float lanes: less than 2^133), and 2^56 chunks
//     (2^64 elements) to less than 2^320.
// So every chunk sum, and every total of them, is an integer multiple of
// 2^-320 below 2^320: 640 bits of fixed point represent all of them exactly,
// and integer addition of those is associative. The limbs hold 32 bits each
// in an int64, so an int64 sum all-reduce of up to 2^31 ranks' normalized
// limbs (each below 2^32) cannot overflow; normalizing the carries after the
// reduction gives the same limbs whatever the order and the world size.
//
// Inf and NaN are not numbers in that range: they are counted in two words
// of their own (a NaN chunk, or any Inf with a NaN, makes the total NaN; an
// Inf chunk makes it +Inf), as a double sum would propagate them.
//
// The value is rounded once, to nearest even, when converted back to double:
// the correctly rounded total, which a sequential double sum only
// approximates.
#pragma once

#include <cstdint>
#include <cstring>

#include "zest/core/platform.h"

namespace zest {

inline constexpr int kExactLimbs = 20;
inline constexpr int kExactLimbBits = 32;
inline constexpr int kExactLsbExponent = -320;  // limb 0 counts units of 2^-320
inline constexpr int kExactNaNWord = kExactLimbs;
inline constexpr int kExactInfWord = kExactLimbs + 1;
// The words of one exact sum: the limbs, then the NaN and Inf counts. An
// all-reduce of kExactWords int64 with ReduceOp::kSum adds two sums.
inline constexpr int kExactWords = kExactLimbs + 2;
static_assert(kExactLimbs * kExactLimbBits + kExactLsbExponent >= 320 && kExactLsbExponent <= -298,
              "the Note's range: multiples of 2^-298 below 2^320");

namespace exact_detail {

inline constexpr int64_t kLimbMask = (int64_t{1} << kExactLimbBits) - 1;

ZEST_HOST_DEVICE inline uint64_t bits_of(double v) {
#ifdef __CUDA_ARCH__
  return static_cast<uint64_t>(__double_as_longlong(v));
#else
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}

ZEST_HOST_DEVICE inline double double_of(uint64_t b) {
#ifdef __CUDA_ARCH__
  return __longlong_as_double(static_cast<long long>(b));
#else
  double v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

ZEST_HOST_DEVICE inline int leading_zeros(uint64_t x) {  // x != 0
#ifdef __CUDA_ARCH__
  return __clzll(static_cast<long long>(x));
#else
  return __builtin_clzll(x);
#endif
}

}  // namespace exact_detail

// Adds v to the sum in w[kExactWords]. False (and w unchanged) when v is not
// in the Note's range: negative, or a finite value that is not a multiple of
// 2^-320 below 2^320. Each add raises a limb by less than 2^32, so 2^31 adds
// fit between normalizations.
ZEST_HOST_DEVICE inline bool exact_add(int64_t* w, double v) {
  const uint64_t b = exact_detail::bits_of(v);
  const uint64_t frac = b & ((uint64_t{1} << 52) - 1);
  const int field = static_cast<int>((b >> 52) & 0x7ff);
  if (field == 0x7ff) {
    if (frac != 0) {
      ++w[kExactNaNWord];
      return true;
    }
    if (b >> 63) return false;  // -Inf: not a sum of squares
    ++w[kExactInfWord];
    return true;
  }
  if ((b & ~(uint64_t{1} << 63)) == 0) return true;  // +0 and -0
  if (b >> 63) return false;
  uint64_t m = field == 0 ? frac : frac | (uint64_t{1} << 52);
  int shift = (field == 0 ? -1074 : field - 1075) - kExactLsbExponent;
  if (shift < 0) {
    if (shift <= -64 || (m & ((uint64_t{1} << -shift) - 1)) != 0) return false;
    m >>= -shift;
    shift = 0;
  }
  if (shift + 53 > kExactLimbs * kExactLimbBits) return false;
  const int limb = shift / kExactLimbBits;
  const int off = shift % kExactLimbBits;
  const uint64_t rest = m >> (kExactLimbBits - off);  // the bits above the first limb
  const uint64_t parts[3] = {(m << off) & exact_detail::kLimbMask, rest & exact_detail::kLimbMask,
                             rest >> kExactLimbBits};
  for (int k = 0; k < 3; ++k) {
    if (parts[k] != 0) w[limb + k] += static_cast<int64_t>(parts[k]);  // in range: checked above
  }
  return true;
}

// Moves carries up so that limbs 0..kExactLimbs-2 lie in [0, 2^32). The
// value is unchanged.
ZEST_HOST_DEVICE inline void exact_normalize(int64_t* w) {
  for (int i = 0; i + 1 < kExactLimbs; ++i) {
    const int64_t carry = w[i] >> kExactLimbBits;  // floor, also for a negative limb
    w[i] &= exact_detail::kLimbMask;
    w[i + 1] += carry;
  }
}

// The sum, rounded once to the nearest double (ties to even): NaN when a NaN
// was added (or the limbs are negative: never, for sums of exact_add), +Inf
// when an Inf was.
ZEST_HOST_DEVICE inline double exact_value(const int64_t* words) {
  if (words[kExactNaNWord] != 0) return exact_detail::double_of(0x7ff8000000000000ull);
  if (words[kExactInfWord] != 0) return exact_detail::double_of(0x7ff0000000000000ull);
  int64_t w[kExactLimbs];
  for (int i = 0; i < kExactLimbs; ++i) w[i] = words[i];
  exact_normalize(w);
  int top = kExactLimbs - 1;
  while (top >= 0 && w[top] == 0) --top;
  if (top < 0) return 0.0;
  // Below 2^320 the top limb is under 2^32 too (the Note); beyond, not a sum
  // of exact_add's values.
  if (w[top] < 0 || w[top] > exact_detail::kLimbMask) return exact_detail::double_of(0x7ff8000000000000ull);
  const auto limb = [&](int i) { return i >= 0 ? static_cast<uint64_t>(w[i]) : uint64_t{0}; };
  // The 96 bits of limbs top, top-1, top-2, normalized so that the leading
  // one is bit 63 of n; every lower bit only decides `sticky`.
  const uint64_t hi = (limb(top) << kExactLimbBits) | limb(top - 1);  // >= 2^32
  const uint64_t lo = limb(top - 2);
  const int lz = exact_detail::leading_zeros(hi);  // <= 31
  const uint64_t n = (hi << lz) | (lo >> (kExactLimbBits - lz));
  bool sticky = ((lo << lz) & exact_detail::kLimbMask) != 0;
  for (int i = top - 3; i >= 0 && !sticky; --i) sticky = w[i] != 0;
  // value = n * 2^e (+ the sticky part below n's last bit)
  int e = kExactLimbBits - lz + kExactLimbBits * (top - 2) + kExactLsbExponent;
  uint64_t mant = n >> 11;
  const uint64_t rem = n & 0x7ff;
  if (rem > 0x400 || (rem == 0x400 && (sticky || (mant & 1) != 0))) ++mant;
  if (mant == (uint64_t{1} << 53)) {
    mant >>= 1;
    ++e;
  }
  e += 11;  // value = mant * 2^e, mant in [2^52, 2^53): always a normal double here
  const auto field = static_cast<uint64_t>(e + 52 + 1023);
  return exact_detail::double_of((field << 52) | (mant & ((uint64_t{1} << 52) - 1)));
}

}  // namespace zest
