// Chunked sums of squares give a norm that is the same bits however the
// buffer is cut into shards, and flag Inf/NaN.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "zest/core/check.h"
#include "zest/optim/grad_norm.h"

using namespace zest;

TEST_CASE("chunk sums are exact for small integers and cover a ragged tail") {
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 7};
  std::vector<double> out(3);
  chunk_sums_of_squares(Stream::default_for(Device::host()), g.data(), DType::kFloat32, g.size(), 3,
                        2.0f, out.data());
  CHECK(out == std::vector<double>{4 * (1 + 4 + 9), 4 * (16 + 25 + 36), 4 * 49});
  CHECK(sum_in_order(out.data(), out.size()) == 4 * 140);
}

TEST_CASE("the norm does not change with the number of shards") {
  constexpr size_t kChunk = 64;
  constexpr size_t kNumel = kChunk * 12;  // shard boundaries at chunk multiples for 1, 2, 3, 4 ranks
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  std::vector<bf16> g(kNumel);
  for (bf16& x : g) x = bf16(normal(rng));
  const Stream s = Stream::default_for(Device::host());

  double reference = -1;
  for (int w : {1, 2, 3, 4}) {
    CAPTURE(w);
    const size_t shard = kNumel / static_cast<size_t>(w);
    std::vector<double> gathered;  // what an all-gather of the ranks' chunk sums gives
    for (int r = 0; r < w; ++r) {
      std::vector<double> mine(shard / kChunk);
      chunk_sums_of_squares(s, g.data() + static_cast<size_t>(r) * shard, DType::kBFloat16, shard, kChunk,
                            1.0f / 1024, mine.data());
      gathered.insert(gathered.end(), mine.begin(), mine.end());
    }
    const double total = sum_in_order(gathered.data(), gathered.size());
    if (reference < 0) reference = total;
    CHECK(total == reference);  // bit for bit
  }
  double naive = 0;
  for (const bf16& x : g) naive += std::pow(static_cast<double>(static_cast<float>(x) / 1024), 2);
  CHECK(reference == doctest::Approx(naive).epsilon(1e-12));
}

TEST_CASE("an Inf or NaN gradient makes its chunk non-finite") {
  std::vector<fp16> g(10, fp16(1.0f));
  g[7] = fp16::from_bits(0x7c00);  // Inf
  std::vector<double> out(2);
  chunk_sums_of_squares(Stream::default_for(Device::host()), g.data(), DType::kFloat16, g.size(), 5,
                        1.0f, out.data());
  CHECK(std::isfinite(out[0]));
  CHECK(std::isinf(out[1]));
  g[7] = fp16::from_bits(0x7e00);  // NaN
  chunk_sums_of_squares(Stream::default_for(Device::host()), g.data(), DType::kFloat16, g.size(), 5,
                        1.0f, out.data());
  CHECK(std::isnan(sum_in_order(out.data(), 2)));
  int32_t bad = 0;
  CHECK_THROWS_WITH_AS(chunk_sums_of_squares(Stream::default_for(Device::host()), &bad, DType::kInt32, 1, 1,
                                             1.0f, out.data()),
                       doctest::Contains("int32 are not supported"), Error);
}
