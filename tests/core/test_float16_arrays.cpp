// core/float16_arrays.h's vector conversions against core/float16.h, one
// element at a time: every fp16 bit pattern widened and narrowed back, and a
// sweep of float bit patterns (every sign and exponent, mantissas with
// rounding ties, NaN payloads, subnormals) narrowed to fp16 and bf16, at
// lengths that leave ragged tails.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "zest/core/cpu_isa.h"
#include "zest/core/float16.h"
#include "zest/core/float16_arrays.h"

using namespace zest;

namespace {

// Equal bits, or both NaN (which NaN a conversion returns is not promised).
bool same_value(uint16_t a, uint16_t b, bool fp16) {
  const auto is_nan = [&](uint16_t x) {
    return fp16 ? std::isnan(fp16_bits_to_float(x)) : std::isnan(bf16_bits_to_float(x));
  };
  return a == b || (is_nan(a) && is_nan(b));
}

// Floats whose narrowing exercises every case: each sign and exponent with
// mantissas at and around the rounding points of fp16 (13 dropped bits) and
// bf16 (16), plus NaN payloads; 17 extra so that no length is a multiple of
// the vector width.
std::vector<float> float_sweep() {
  std::vector<float> out;
  const uint32_t mantissas[] = {0x000000, 0x000001, 0x000fff, 0x001000, 0x001001, 0x002000, 0x003000,
                                0x007fff, 0x008000, 0x008001, 0x010000, 0x018000, 0x3fffff, 0x400000,
                                0x400001, 0x7f8000, 0x7fffff, 0x5a5a5a};
  for (uint32_t sign : {0u, 1u}) {
    for (uint32_t exponent = 0; exponent < 256; ++exponent) {
      for (uint32_t m : mantissas) {
        const uint32_t bits = sign << 31 | exponent << 23 | m;
        float f;
        std::memcpy(&f, &bits, sizeof(f));
        out.push_back(f);
      }
    }
  }
  out.resize(out.size() + 17, 1.0f);
  return out;
}

}  // namespace

// Skipped (and reported so) on CPUs without AVX2 and F16C, where these
// loops are never called.
TEST_CASE("F16C's fp16 conversions give core/float16.h's bits" * doctest::skip(!cpu_supports(CpuIsa::kAvx2))) {
  std::vector<fp16> all(65536 + 5);
  for (size_t i = 0; i < all.size(); ++i) all[i] = fp16::from_bits(static_cast<uint16_t>(i));
  std::vector<float> wide(all.size());
  detail::widen_f16c(all.data(), wide.data(), all.size());
  size_t wrong = 0;
  for (size_t i = 0; i < all.size(); ++i) {
    const float want = static_cast<float>(all[i]);
    const bool ok = std::isnan(want) ? std::isnan(wide[i]) : std::memcmp(&want, &wide[i], sizeof(float)) == 0;
    wrong += ok ? 0 : 1;
  }
  CHECK(wrong == 0);
  const std::vector<float> sweep = float_sweep();
  std::vector<fp16> narrow(sweep.size());
  detail::narrow_f16c(sweep.data(), narrow.data(), sweep.size());
  wrong = 0;
  for (size_t i = 0; i < sweep.size(); ++i) wrong += same_value(narrow[i].bits, fp16(sweep[i]).bits, true) ? 0 : 1;
  CHECK(wrong == 0);
}

TEST_CASE("AVX2's bf16 narrowing gives core/float16.h's bits" * doctest::skip(!cpu_supports(CpuIsa::kAvx2))) {
  const std::vector<float> sweep = float_sweep();
  for (size_t len : {sweep.size(), sweep.size() - 1, size_t{15}, size_t{16}, size_t{0}}) {
    std::vector<bf16> narrow(len);
    detail::narrow_bf16_avx2(sweep.data(), narrow.data(), len);
    size_t wrong = 0;
    for (size_t i = 0; i < len; ++i) wrong += same_value(narrow[i].bits, bf16(sweep[i]).bits, false) ? 0 : 1;
    INFO("length ", len);
    CHECK(wrong == 0);
  }
  // A NaN keeps its sign and top payload bits: the same bits, not just a NaN.
  const uint32_t nans[] = {0x7f800001u, 0xff812345u, 0x7fc00000u, 0x7fbfffffu};
  std::vector<float> in(16, 0.0f);
  for (size_t k = 0; k < 4; ++k) std::memcpy(&in[k], &nans[k], sizeof(float));
  std::vector<bf16> out(16);
  detail::narrow_bf16_avx2(in.data(), out.data(), in.size());
  for (size_t k = 0; k < 4; ++k) CHECK(out[k].bits == bf16(in[k]).bits);
}
