// accumulate and convert on the host against values worked out by hand (and
// checked with exact rational arithmetic): ties to even at the rounding
// boundaries of each type, overflow to Inf, subnormals, signed zeros, and
// every pair of dtypes. Also copy_bytes and fill_zero, which the engine
// uses alongside them. tests/cuda/test_cuda_optim.cu holds the GPU to these.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "zest/core/check.h"
#include "zest/memory/copy.h"
#include "zest/optim/grad_ops.h"

using namespace zest;
using zest::detail::bits_float;
using zest::detail::float_bits;

namespace {

Stream host() { return Stream::default_for(Device::host()); }

// Values are written as bit patterns so that a test can name a value exactly
// (fp16 0x3c01 is 1 + 2^-10) and compare results exactly (-0 and Inf too).
template <typename T>
T from_bits(uint32_t b) {
  if constexpr (std::is_same_v<T, float>) {
    return bits_float(b);
  } else {
    return T::from_bits(static_cast<uint16_t>(b));
  }
}

template <typename T>
uint32_t to_bits(T v) {
  if constexpr (std::is_same_v<T, float>) {
    return float_bits(v);
  } else {
    return v.bits;
  }
}

template <typename T>
std::vector<T> from_bits(const std::vector<uint32_t>& b) {
  std::vector<T> out;
  for (uint32_t x : b) out.push_back(from_bits<T>(x));
  return out;
}

template <typename T>
std::vector<uint32_t> to_bits(const std::vector<T>& v) {
  std::vector<uint32_t> out;
  for (T x : v) out.push_back(to_bits(x));
  return out;
}

template <typename T>
std::vector<uint32_t> accumulate_bits(const std::vector<uint32_t>& dst_bits,
                                      const std::vector<uint32_t>& src_bits) {
  std::vector<T> dst = from_bits<T>(dst_bits);
  const std::vector<T> src = from_bits<T>(src_bits);
  accumulate(host(), dst.data(), src.data(), dtype_of_v<T>, dst.size());
  return to_bits(dst);
}

template <typename TS, typename TD>
std::vector<uint32_t> convert_bits(const std::vector<uint32_t>& src_bits) {
  const std::vector<TS> src = from_bits<TS>(src_bits);
  std::vector<TD> dst(src.size());
  convert(host(), src.data(), dtype_of_v<TS>, dst.data(), dtype_of_v<TD>, src.size());
  return to_bits(dst);
}

uint32_t f(float x) { return float_bits(x); }

constexpr uint32_t kFloatInf = 0x7f800000u;
constexpr uint32_t kFloatNegInf = 0xff800000u;

}  // namespace

TEST_CASE("fp32 accumulate is one float add: ties to even, signed zero, Inf") {
  const float a = std::ldexp(1.0f, -24);  // half an ulp of 1
  const std::vector<uint32_t> dst = {f(1.0f), f(1.0f + 2 * a), f(1e30f), f(-2.5f), kFloatInf, f(3.0f)};
  const std::vector<uint32_t> src = {f(a), f(a), f(1e30f), f(2.5f), f(1.0f), kFloatNegInf};
  const std::vector<uint32_t> expected = {
      f(1.0f),           // tie between 1 and 1 + 2^-23: the even one
      f(1.0f + 4 * a),   // 1 + 3 * 2^-24: tie, up to the even 1 + 2^-22
      f(2e30f),
      f(0.0f),           // +0, not -0
      kFloatInf, kFloatNegInf};
  CHECK(accumulate_bits<float>(dst, src) == expected);
}

TEST_CASE("fp16 accumulate adds in float and rounds once, ties to even") {
  // 1 + 2^-11 and 1 + 3 * 2^-11 lie halfway between fp16 neighbours (ulp
  // 2^-10 there), as do 2049 and 2051 (ulp 2); 65504 + 16 = 65520 is the
  // halfway point to 65536 and so rounds to Inf, 65519 does not.
  const std::vector<uint32_t> dst = {0x3c00, 0x3c01, 0x6800, 0x6801, 0x7bff, 0x7bff, 0x0001, 0xbc00};
  const std::vector<uint32_t> src = {0x1000, 0x1000, 0x3c00, 0x3c00, 0x4b80, 0x4c00, 0x0001, 0x3c00};
  const std::vector<uint32_t> expected = {0x3c00, 0x3c02, 0x6800, 0x6802, 0x7bff, 0x7c00, 0x0002,
                                          0x0000};
  CHECK(accumulate_bits<fp16>(dst, src) == expected);
}

TEST_CASE("bf16 accumulate adds in float and rounds once, ties to even") {
  // 1 + 2^-8 and 1 + 3 * 2^-8 are ties (ulp 2^-7); 1 + 2^-8 + 2^-15 is just
  // past one. 257 and 259 are ties at ulp 2; 129 is exact at ulp 1.
  const std::vector<uint32_t> dst = {0x3f80, 0x3f81, 0x3f80, 0x7f7f, 0x4300, 0x4380, 0x4381};
  const std::vector<uint32_t> src = {0x3b80, 0x3b80, 0x3b81, 0x7f7f, 0x3f80, 0x3f80, 0x3f80};
  const std::vector<uint32_t> expected = {0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x4301, 0x4380, 0x4382};
  CHECK(accumulate_bits<bf16>(dst, src) == expected);
}

TEST_CASE("accumulate into itself doubles, keeps NaN, and needs no pointers for zero elements") {
  std::vector<bf16> x = {bf16(1.5f), bf16(-3.0f), bf16::from_bits(0x7fc1)};
  accumulate(host(), x.data(), x.data(), DType::kBFloat16, x.size());
  CHECK(static_cast<float>(x[0]) == 3.0f);
  CHECK(static_cast<float>(x[1]) == -6.0f);
  CHECK(std::isnan(static_cast<float>(x[2])));
  accumulate(host(), nullptr, nullptr, DType::kFloat16, 0);
}

TEST_CASE("fp32 to fp16 rounds to nearest even, overflows to Inf past 65504") {
  const float h = std::ldexp(1.0f, -11);  // half an fp16 ulp of 1
  const float tiny = std::ldexp(1.0f, -25);  // half the smallest fp16 subnormal
  const std::vector<uint32_t> src = {
      f(1.0f), f(65504.0f), f(65520.0f), f(std::nextafter(65520.0f, 0.0f)), f(1.0f + h),
      f(1.0f + 3 * h), f(2 * tiny), f(tiny), f(tiny + std::ldexp(1.0f, -40)), f(3 * tiny),
      f(-2.0f), kFloatInf, kFloatNegInf, f(1e-30f), f(-0.0f)};
  const std::vector<uint32_t> expected = {0x3c00, 0x7bff, 0x7c00, 0x7bff, 0x3c00, 0x3c02, 0x0001, 0x0000,
                                          0x0001, 0x0002, 0xc000, 0x7c00, 0xfc00, 0x0000, 0x8000};
  CHECK(convert_bits<float, fp16>(src) == expected);
}

TEST_CASE("fp32 to bf16 rounds to nearest even, FLT_MAX to Inf") {
  const float h = std::ldexp(1.0f, -8);  // half a bf16 ulp of 1
  const std::vector<uint32_t> src = {
      f(1.0f), f(1.0f + h), f(1.0f + 3 * h), f(1.0f + h + std::ldexp(1.0f, -23)),
      f(std::numeric_limits<float>::max()),
      0x7f7f7fffu,  // just below the halfway point to Inf
      f(-1.5f), 0x00010000u, 0x00000001u, 0x00008000u, 0x00018000u, kFloatInf};
  const std::vector<uint32_t> expected = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x7f80, 0x7f7f,
                                          0xbfc0, 0x0001, 0x0000, 0x0000, 0x0002, 0x7f80};
  CHECK(convert_bits<float, bf16>(src) == expected);
}

TEST_CASE("fp16 and bf16 widen to fp32 exactly") {
  CHECK(convert_bits<fp16, float>({0x3c00, 0x0001, 0x03ff, 0x7bff, 0xfc00, 0x3555, 0x8000}) ==
        std::vector<uint32_t>{f(1.0f), f(std::ldexp(1.0f, -24)), f(std::ldexp(1023.0f, -24)),
                              f(65504.0f), kFloatNegInf, f(0.333251953125f), f(-0.0f)});
  CHECK(convert_bits<bf16, float>({0x3f81, 0x0001, 0xff80, 0x4049}) ==
        std::vector<uint32_t>{f(1.0078125f), 0x00010000u, kFloatNegInf, f(3.140625f)});
}

TEST_CASE("fp16 to bf16 rounds once to nearest even") {
  // 1 + k * 2^-10 against bf16's ulp of 2^-7: k = 1 down, 4 a tie down to
  // even, 6 up, 12 and 20 ties to the even neighbour. 65504 rounds up to
  // 65536, and fp16's smallest subnormal is a normal bf16.
  CHECK(convert_bits<fp16, bf16>({0x3c01, 0x3c04, 0x3c06, 0x3c0c, 0x3c14, 0x7bff, 0x0001, 0xfc00,
                                  0x8000}) ==
        std::vector<uint32_t>{0x3f80, 0x3f80, 0x3f81, 0x3f82, 0x3f82, 0x4780, 0x3380, 0xff80, 0x8000});
}

TEST_CASE("bf16 to fp16 rounds once to nearest even, into subnormals and Inf") {
  // 65536 and beyond overflow; 2^-25 is a tie between 0 and the smallest
  // subnormal (to 0), 1.5 * 2^-24 a tie between 1 and 2 of them (to 2).
  CHECK(convert_bits<bf16, fp16>({0x3f81, 0x4780, 0x477f, 0x3380, 0x3300, 0x3340, 0x33c0, 0x1f80,
                                  0xc040, 0x7f80}) ==
        std::vector<uint32_t>{0x3c08, 0x7c00, 0x7bf8, 0x0001, 0x0000, 0x0001, 0x0002, 0x0000,
                              0xc200, 0x7c00});
}

TEST_CASE("NaN stays NaN in every conversion, and equal dtypes copy the bits") {
  CHECK(std::isnan(static_cast<float>(from_bits<fp16>(convert_bits<float, fp16>({0x7fc00000u})[0]))));
  CHECK(std::isnan(static_cast<float>(from_bits<bf16>(convert_bits<float, bf16>({0xffa00001u})[0]))));
  CHECK(std::isnan(bits_float(convert_bits<fp16, float>({0x7e01})[0])));
  CHECK(std::isnan(bits_float(convert_bits<bf16, float>({0xffc1})[0])));
  CHECK(std::isnan(static_cast<float>(from_bits<bf16>(convert_bits<fp16, bf16>({0x7d23})[0]))));
  CHECK(std::isnan(static_cast<float>(from_bits<fp16>(convert_bits<bf16, fp16>({0x7fc1})[0]))));
  // A copy keeps even a signalling NaN's payload.
  CHECK(convert_bits<float, float>({0x7fa00001u, f(-0.0f), f(1.5f)}) ==
        std::vector<uint32_t>{0x7fa00001u, f(-0.0f), f(1.5f)});
  CHECK(convert_bits<fp16, fp16>({0x7d23, 0x3c01}) == std::vector<uint32_t>{0x7d23, 0x3c01});
  CHECK(convert_bits<bf16, bf16>({0xff81, 0x0001}) == std::vector<uint32_t>{0xff81, 0x0001});
}

TEST_CASE("accumulate into fp32 from bf16 and fp16 keeps the bits a 16-bit sum rounds away") {
  // bf16 1 + 2^-9 (a quarter of bf16's spacing at 1) eight times: exact in
  // fp32, 1 in bf16.
  std::vector<float> wide(3, 0.0f);
  std::vector<bf16> narrow(3, bf16(0.0f));
  const std::vector<bf16> first = {bf16(1.0f), bf16(-2.0f), bf16(1.5f)};
  const std::vector<bf16> small(3, bf16(1.0f / 512.0f));
  accumulate(host(), wide.data(), DType::kFloat32, first.data(), DType::kBFloat16, 3);
  accumulate(host(), narrow.data(), first.data(), DType::kBFloat16, 3);
  for (int k = 0; k < 7; ++k) {
    accumulate(host(), wide.data(), DType::kFloat32, small.data(), DType::kBFloat16, 3);
    accumulate(host(), narrow.data(), DType::kBFloat16, small.data(), DType::kBFloat16, 3);
  }
  CHECK(wide == std::vector<float>{1.0f + 7.0f / 512.0f, -2.0f + 7.0f / 512.0f, 1.5f + 7.0f / 512.0f});
  for (size_t i = 0; i < 3; ++i) CHECK(static_cast<float>(narrow[i]) == static_cast<float>(first[i]));
  // fp16 into fp32: 65504 + 65504 overflows fp16, not fp32; a subnormal adds exactly.
  std::vector<float> acc = {65504.0f, 0.0f};
  const std::vector<uint32_t> h = {0x7bff, 0x0001};  // 65504, 2^-24
  std::vector<fp16> src = {from_bits<fp16>(h[0]), from_bits<fp16>(h[1])};
  accumulate(host(), acc.data(), DType::kFloat32, src.data(), DType::kFloat16, 2);
  CHECK(acc == std::vector<float>{131008.0f, std::ldexp(1.0f, -24)});
  // fp32 into bf16 rounds once, to nearest even: 1 + (2^-8 + 2^-20) is above
  // the tie at 1 + 2^-8, so it rounds up to 1 + 2^-7.
  std::vector<bf16> into = {bf16(1.0f)};
  const std::vector<float> add = {std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)};
  accumulate(host(), into.data(), DType::kBFloat16, add.data(), DType::kFloat32, 1);
  CHECK(static_cast<float>(into[0]) == 1.0f + std::ldexp(1.0f, -7));
}

TEST_CASE("grad ops refuse other dtypes and null buffers, naming them") {
  using doctest::Contains;
  int32_t i = 0;
  float x = 0;
  CHECK_THROWS_WITH_AS(
      accumulate(host(), &i, &i, DType::kInt32, 1),
      Contains("accumulate: destinations of dtype int32 are not supported (fp32, fp16 or bf16)"), Error);
  CHECK_THROWS_WITH_AS(
      accumulate(host(), &x, DType::kFloat32, &i, DType::kInt32, 1),
      Contains("accumulate: sources of dtype int32 are not supported (fp32, fp16 or bf16)"), Error);
  CHECK_THROWS_WITH_AS(
      convert(host(), &i, DType::kInt64, &x, DType::kFloat32, 1),
      Contains("convert: sources of dtype int64 are not supported (fp32, fp16 or bf16)"), Error);
  CHECK_THROWS_WITH_AS(
      convert(host(), &x, DType::kFloat32, &i, DType::kUInt8, 1),
      Contains("convert: destinations of dtype uint8 are not supported (fp32, fp16 or bf16)"), Error);
  // A dtype is checked even when there is nothing to do: the call is wrong.
  CHECK_THROWS_AS(convert(host(), nullptr, DType::kInt32, nullptr, DType::kInt32, 0), Error);
  CHECK_THROWS_WITH_AS(
      accumulate(host(), &x, nullptr, DType::kFloat32, 3),
      Contains("accumulate: the source pointer is null for 3 elements (fp32 into fp32) on host"), Error);
  CHECK_THROWS_WITH_AS(
      convert(host(), &x, DType::kFloat32, nullptr, DType::kFloat16, 2),
      Contains("convert: the destination pointer is null for 2 elements (fp32 to fp16) on host"), Error);
  convert(host(), nullptr, DType::kFloat32, nullptr, DType::kBFloat16, 0);
}

TEST_CASE("copy_bytes copies, and refuses null pointers and overlapping ranges") {
  std::vector<uint8_t> src(100);
  for (size_t k = 0; k < src.size(); ++k) src[k] = static_cast<uint8_t>(3 * k + 1);
  std::vector<uint8_t> dst(100, 0xee);
  copy_bytes(host(), dst.data() + 10, src.data(), 80);
  CHECK(std::vector<uint8_t>(dst.begin(), dst.begin() + 10) == std::vector<uint8_t>(10, 0xee));
  CHECK(std::memcmp(dst.data() + 10, src.data(), 80) == 0);
  CHECK(std::vector<uint8_t>(dst.begin() + 90, dst.end()) == std::vector<uint8_t>(10, 0xee));

  copy_bytes(host(), nullptr, nullptr, 0);
  copy_bytes(host(), dst.data(), dst.data(), dst.size());  // onto itself: nothing to do
  CHECK_THROWS_WITH_AS(
      copy_bytes(host(), dst.data(), nullptr, 8),
      doctest::Contains("copy_bytes: the source pointer is null for a copy of 8 bytes on host"), Error);
  CHECK_THROWS_WITH_AS(copy_bytes(host(), nullptr, src.data(), 8),
                       doctest::Contains("the destination pointer is null"), Error);
  CHECK_THROWS_WITH_AS(copy_bytes(host(), dst.data() + 1, dst.data(), 2),
                       doctest::Contains("overlap in a copy of 2 bytes"), Error);
  CHECK_THROWS_WITH_AS(copy_bytes(host(), dst.data(), dst.data() + 1, 2),
                       doctest::Contains("overlap"), Error);
  copy_bytes(host(), dst.data(), dst.data() + 2, 2);  // adjacent is not overlapping
}

TEST_CASE("fill_zero zeroes exactly the bytes asked for") {
  std::vector<uint8_t> v(64, 0xab);
  fill_zero(host(), v.data() + 5, 50);
  for (size_t k = 0; k < v.size(); ++k) {
    CAPTURE(k);
    CHECK(v[k] == (k >= 5 && k < 55 ? 0 : 0xab));
  }
  fill_zero(host(), nullptr, 0);
  CHECK_THROWS_WITH_AS(
      fill_zero(host(), nullptr, 4),
      doctest::Contains("fill_zero: the destination pointer is null for 4 bytes on host"), Error);
}

TEST_CASE("scale multiplies in float and rounds once to the buffer's dtype") {
  // fp16: 1 + 2^-10 times 1/3 in float is 0.33365..., rounded once; a
  // product past 65504 is Inf.
  std::vector<fp16> h = {fp16::from_bits(0x3c01), fp16(3.0f), fp16(40000.0f), fp16::from_bits(0x7e00)};
  const float third = static_cast<float>(1.0 / 3.0);
  std::vector<float> want;
  for (const fp16& x : h) want.push_back(static_cast<float>(fp16(static_cast<float>(x) * third)));
  want[2] = static_cast<float>(fp16(40000.0f * third));
  scale(host(), h.data(), DType::kFloat16, third, h.size());
  for (size_t i = 0; i < 3; ++i) CHECK(static_cast<float>(h[i]) == want[i]);
  CHECK(static_cast<float>(h[1]) == 1.0f);
  CHECK(std::isnan(static_cast<float>(h[3])));
  std::vector<fp16> big = {fp16(40000.0f)};
  scale(host(), big.data(), DType::kFloat16, 2.0f, 1);
  CHECK(std::isinf(static_cast<float>(big[0])));
  // bf16 over several host blocks, and fp32 in place.
  std::vector<bf16> b(5000, bf16(1.0078125f));  // 1 + 2^-7
  scale(host(), b.data(), DType::kBFloat16, 0.6f, b.size());
  for (const bf16& x : b) REQUIRE(x.bits == bf16(1.0078125f * 0.6f).bits);
  std::vector<float> f = {1.0f, -2.5f};
  scale(host(), f.data(), DType::kFloat32, 0.1f, f.size());
  CHECK(f == std::vector<float>{0.1f, -2.5f * 0.1f});
  scale(host(), nullptr, DType::kFloat16, 2.0f, 0);
  CHECK_THROWS_WITH_AS(scale(host(), nullptr, DType::kFloat16, 2.0f, 3), doctest::Contains("scale: the buffer is null"),
                       Error);
}
