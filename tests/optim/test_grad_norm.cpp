// Chunked sums of squares give a norm that is the same bits however the
// buffer is cut into shards, and flag Inf/NaN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"
#include "zest/optim/chunk_sum_order.h"
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

TEST_CASE("a chunk in the GPU's order (a warp per chunk): its tree, exact small sums, the host's bits on every ISA") {
  // The shuffle tree pairs lanes 1 and 17 before lane 0 sees them: 1 + 2^-52,
  // where adding the lanes in index order gives 1.
  double lanes[kNormWarp] = {};
  lanes[0] = 1.0;
  lanes[1] = lanes[17] = std::ldexp(1.0, -53);
  CHECK(warp_tree(lanes) == 1.0 + std::ldexp(1.0, -52));

  std::vector<float> small(300);
  double exact = 0;
  for (size_t i = 0; i < small.size(); ++i) {
    small[i] = static_cast<float>(static_cast<int>(i % 17) - 8);
    exact += 4.0 * small[i] * small[i];
  }
  const auto at = [&](size_t i) { return small[i]; };
  CHECK(warp_order_sum_of_squares(at, 0, small.size(), 2.0f) == exact);
  CHECK(warp_order_sum_of_squares(at, 5, 5, 2.0f) == 0.0);  // an empty chunk

  // The host's vector loop against the element-by-element order, bit for
  // bit: bf16 and fp16 (widened in blocks) and fp32, chunks of 256 with a
  // ragged tail, chunks larger than a widening block, and chunks not a
  // multiple of the 32 lanes.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(256 * 9 + 31);
  for (float& x : f) x = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);
  std::vector<bf16> b(f.size());
  std::vector<fp16> h(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    b[i] = bf16(f[i]);
    h[i] = fp16(f[i] / 1024.0f);
  }
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa force(isa);
    const std::string_view isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    // A scale of 1 takes the loop without the multiply (Note [the tree on
    // vectors]); 0.5 the one with it.
    for (const auto& [chunk, scale] : {std::pair<size_t, float>{256, 0.5f}, {256, 1.0f}, {3000, 0.5f}, {3000, 1.0f},
                                       {45, 0.5f}, {1, 1.0f}}) {
      CAPTURE(chunk);
      CAPTURE(scale);
      const size_t chunks = (f.size() + chunk - 1) / chunk;
      const auto check = [&](DType dtype, const void* data, auto load) {
        const std::string_view dtype_text = dtype_name(dtype);
        CAPTURE(dtype_text);
        std::vector<double> host(chunks);
        chunk_sums_of_squares(Stream::default_for(Device::host()), data, dtype, f.size(), chunk, scale, host.data());
        for (size_t c = 0; c < chunks; ++c) {
          CAPTURE(c);
          const double want =
              warp_order_sum_of_squares(load, c * chunk, std::min(f.size(), c * chunk + chunk), scale);
          CHECK(host[c] == want);
        }
      };
      check(DType::kFloat32, f.data(), [&](size_t i) { return f[i]; });
      check(DType::kBFloat16, b.data(), [&](size_t i) { return static_cast<float>(b[i]); });
      check(DType::kFloat16, h.data(), [&](size_t i) { return static_cast<float>(h[i]); });
    }
  }
}
