// The exact fixed-point sum behind the gradient norm: exact over its whole
// range, rounded once, the same bits in any order and any split into ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "zest/core/check.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/exact_sum_grid.h"
#include "zest/optim/grad_norm.h"

using namespace zest;

namespace {

using Words = std::array<int64_t, kExactWords>;

Words sum_of(const std::vector<double>& values) {
  Words w{};
  for (double v : values) REQUIRE(exact_add(w.data(), v));
  exact_normalize(w.data());
  return w;
}

double value_of(const std::vector<double>& values) { return exact_value(sum_of(values).data()); }

// Chunk-sum-like values: sums of squares of floats over a wide range.
std::vector<double> chunk_sum_like(std::mt19937_64& rng, size_t n) {
  std::uniform_real_distribution<float> mag(-30.0f, 30.0f);
  std::vector<double> values(n);
  for (double& v : values) {
    double acc = 0;
    for (int k = 0; k < 4; ++k) {
      const float x = std::ldexp(1.0f + static_cast<float>(rng() % 1000) / 997.0f, static_cast<int>(mag(rng)));
      acc += static_cast<double>(x) * x;
    }
    v = acc;
  }
  return values;
}

}  // namespace

TEST_CASE("small sums are exact, and the total is rounded once to nearest even") {
  CHECK(value_of({}) == 0.0);
  CHECK(value_of({0.0, -0.0}) == 0.0);
  CHECK(value_of({1.0, 2.0, 0.5}) == 3.5);
  // 1 + 2^-53 is a tie: to even, 1. One more 2^-100 breaks it upwards, which
  // a sequential double sum (1, then 1 again) never sees.
  CHECK(value_of({1.0, std::ldexp(1.0, -53)}) == 1.0);
  CHECK(value_of({1.0, std::ldexp(1.0, -53), std::ldexp(1.0, -100)}) == 1.0 + std::ldexp(1.0, -52));
  CHECK((1.0 + std::ldexp(1.0, -53)) + std::ldexp(1.0, -100) == 1.0);
  // The odd neighbour of 1 + 2^-52 ties upwards to even.
  const double odd = 1.0 + std::ldexp(1.0, -52);
  CHECK(value_of({odd, std::ldexp(1.0, -53)}) == 1.0 + std::ldexp(1.0, -51));
  // Many small values that a double sum would drop one by one.
  std::vector<double> many(1 << 12, std::ldexp(1.0, -60));
  many.insert(many.begin(), 1.0);
  CHECK(value_of(many) == 1.0 + std::ldexp(1.0, -48));
}

TEST_CASE("the whole range of sums of squares of finite floats is exact") {
  const double tiny = std::ldexp(1.0, -298);  // the square of the smallest float subnormal
  const float fmax = std::numeric_limits<float>::max();
  const double big = static_cast<double>(fmax) * fmax;  // < 2^256
  CHECK(value_of({tiny}) == tiny);
  CHECK(value_of({big}) == big);
  CHECK(value_of({big, tiny}) == big);  // rounded: tiny is far below big's last bit
  // 2^56 chunks of 256 maximal squares stay below 2^320: here 2^60 of them
  // as one value plus the rest, the top of the range.
  const double top = std::ldexp(1.0, 319);
  CHECK(value_of({top, top * 0.5, top * 0.25}) == top * 1.75);
  // subtracting back down: the limbs keep the tiny part exactly
  Words w = sum_of({big, tiny});
  Words minus = sum_of({big});
  for (int i = 0; i < kExactLimbs; ++i) w[static_cast<size_t>(i)] -= minus[static_cast<size_t>(i)];
  CHECK(exact_value(w.data()) == tiny);
  // outside the range: refused, and the sum unchanged
  Words bad{};
  CHECK_FALSE(exact_add(bad.data(), -1.0));
  CHECK_FALSE(exact_add(bad.data(), std::ldexp(1.0, -1074)));  // not a multiple of 2^-320
  CHECK_FALSE(exact_add(bad.data(), std::ldexp(1.0, 330)));
  CHECK_FALSE(exact_add(bad.data(), -std::numeric_limits<double>::infinity()));
  CHECK(bad == Words{});
}

TEST_CASE("Inf and NaN are counted apart: NaN wins, then Inf") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  CHECK(std::isinf(value_of({1.0, inf})));
  CHECK(value_of({1.0, inf}) > 0);
  CHECK(std::isnan(value_of({1.0, nan})));
  CHECK(std::isnan(value_of({inf, nan, 2.0})));
  CHECK(sum_of({inf, inf, nan})[kExactInfWord] == 2);
}

TEST_CASE("any order and any split into ranks gives the same words") {
  std::mt19937_64 rng(11);
  std::vector<double> values = chunk_sum_like(rng, 3000);
  const Words reference = sum_of(values);
  // x87 long double adds with 64-bit significands: 3000 roundings stay
  // within 3000 x 2^-64 of the exact total.
  long double wide = 0;
  for (double v : values) wide += v;
  CHECK(exact_value(reference.data()) == doctest::Approx(static_cast<double>(wide)).epsilon(1e-15));
  for (int world : {2, 3, 7}) {
    CAPTURE(world);
    std::shuffle(values.begin(), values.end(), rng);
    // each "rank" sums its part; an int64 sum all-reduce adds the words
    Words reduced{};
    for (int r = 0; r < world; ++r) {
      std::vector<double> part;
      for (size_t i = static_cast<size_t>(r); i < values.size(); i += static_cast<size_t>(world)) part.push_back(values[i]);
      const Words w = sum_of(part);
      for (int k = 0; k < kExactWords; ++k) {
        CHECK(w[static_cast<size_t>(k)] >= 0);
        if (k + 1 < kExactLimbs) CHECK(w[static_cast<size_t>(k)] < (int64_t{1} << 32));
        reduced[static_cast<size_t>(k)] += w[static_cast<size_t>(k)];
      }
    }
    exact_normalize(reduced.data());
    CHECK(reduced == reference);
  }
}

TEST_CASE("accumulate_exact adds chunk sums into normalized words, and names a bad one") {
  const Stream s = Stream::default_for(Device::host());
  const std::vector<double> sums = {1.0, 0.25, std::ldexp(1.0, 200)};
  Words w{};
  accumulate_exact(s, sums.data(), 2, w.data());
  accumulate_exact(s, sums.data() + 2, 1, w.data());
  CHECK(w == sum_of(sums));
  const double negative = -1.0;
  CHECK_THROWS_WITH_AS(accumulate_exact(s, &negative, 1, w.data()),
                       doctest::Contains("chunk sum -1 at 0 is not a sum of squares"), Error);
}

TEST_CASE("the GPU's grid of blocks adds chunk sums to the host loop's bits, at any grid") {
  std::mt19937_64 rng(5);
  std::vector<double> values = chunk_sum_like(rng, 20000);
  // The ends of the range, and zeros, among them.
  values[17] = std::ldexp(1.0, 250);
  values[4099] = std::ldexp(1.0, -298);
  values[12345] = 0.0;
  values[19999] = std::ldexp(3.0, -290);
  const Stream host = Stream::default_for(Device::host());
  // Into an accumulator that already holds a sum, as the engine adds units.
  Words start{};
  accumulate_exact(host, values.data(), 5, start.data());
  Words reference = start;
  accumulate_exact(host, values.data(), values.size(), reference.data());
  const unsigned production = exact_grid_blocks(values.size());
  CHECK(production == 5);  // 20000 sums, 4096 per block
  struct Grid {
    unsigned blocks;
    unsigned threads;
  };
  for (const Grid g : {Grid{1, kExactThreads}, Grid{production, kExactThreads}, Grid{3, kExactThreads},
                       Grid{200, kExactThreads}, Grid{7, 32}, Grid{64, 2}, Grid{1, 1}}) {
    CAPTURE(g.blocks);
    CAPTURE(g.threads);
    Words got = start;
    accumulate_exact_grid_model(values.data(), values.size(), got.data(), g.blocks, g.threads);
    CHECK(got == reference);
  }
  // Nothing to add leaves the sum as it was, normalized.
  Words same = reference;
  accumulate_exact_grid_model(values.data(), 0, same.data(), 1, kExactThreads);
  CHECK(same == reference);
}

TEST_CASE("the grid counts Inf and NaN as the host does, and an impossible value as NaN") {
  const Stream host = Stream::default_for(Device::host());
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const std::vector<double> with_inf = {1.0, inf, 2.0, inf, 0.5};
  Words reference{};
  accumulate_exact(host, with_inf.data(), with_inf.size(), reference.data());
  Words got{};
  accumulate_exact_grid_model(with_inf.data(), with_inf.size(), got.data(), 2, 2);
  CHECK(got == reference);
  CHECK(got[kExactInfWord] == 2);
  CHECK(exact_value(got.data()) == inf);
  const std::vector<double> with_nan = {1.0, nan, inf};
  Words nan_words{};
  accumulate_exact_grid_model(with_nan.data(), with_nan.size(), nan_words.data(), 3, 4);
  CHECK(nan_words[kExactNaNWord] == 1);
  CHECK(std::isnan(exact_value(nan_words.data())));
  // The host refuses a negative "chunk sum"; the GPU cannot throw, and
  // counts it as a NaN so that the step is skipped.
  const std::vector<double> negative = {1.0, -1.0};
  Words neg_words{};
  accumulate_exact_grid_model(negative.data(), negative.size(), neg_words.data(), 1, 2);
  CHECK(neg_words[kExactNaNWord] == 1);
  CHECK(std::isnan(exact_value(neg_words.data())));
}

TEST_CASE("the grid has about 32 sums per thread, at least one block and at most 4096") {
  CHECK(exact_grid_blocks(0) == 1);
  CHECK(exact_grid_blocks(1) == 1);
  CHECK(exact_grid_blocks(kExactThreads * kExactSumsPerThread) == 1);
  CHECK(exact_grid_blocks(kExactThreads * kExactSumsPerThread + 1) == 2);
  CHECK(exact_grid_blocks(size_t{1} << 40) == kExactMaxBlocks);
}
