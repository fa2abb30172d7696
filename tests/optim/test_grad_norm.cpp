// Chunked sums of squares give a norm that is the same bits however the
// buffer is cut into shards, and flag Inf/NaN.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>
#include <vector>

#include "core/stream_gate.h"
#include "zest/core/check.h"
#include "zest/core/cpu_isa.h"
#include "zest/optim/chunk_sum_order.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/grad_norm.h"
#include "zest/optim/step_decision.h"

using namespace zest;

TEST_CASE("chunk sums are exact for small integers and cover a ragged tail") {
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 7};
  std::vector<double> out(3);
  chunk_sums_of_squares(Stream::default_for(Device::host()), g.data(), DType::kFloat32, g.size(), 3,
                        2.0f, out.data());
  CHECK(out == std::vector<double>{4 * (1 + 4 + 9), 4 * (16 + 25 + 36), 4 * 49});
  CHECK(sum_in_order(out.data(), out.size()) == 4 * 140);
}

TEST_CASE("on a host stream with its own thread the norm's work runs there, in order") {
  // Held behind a gate, nothing is written; opened, the chunk sums, their
  // exact total and the decision come out as on an inline stream.
  OwnedStream stream(Device::host(), HostWork::kOwnThread);
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 7};
  std::vector<double> sums(3, -1.0);
  std::vector<int64_t> words(kExactWords, 0);  // zeroed by the caller, as the engine does
  test::StreamGate gate;
  gate.hold(stream);
  chunk_sums_of_squares(stream, g.data(), DType::kFloat32, g.size(), 3, 2.0f, sums.data());
  accumulate_exact(stream, sums.data(), sums.size(), words.data());
  decide_step(stream, words.data(), 0.5, 0.0);
  CHECK(sums == std::vector<double>(3, -1.0));  // still queued
  gate.open();
  stream.get().synchronize();
  CHECK(sums == std::vector<double>{4 * (1 + 4 + 9), 4 * (16 + 25 + 36), 4 * 49});
  // Small integers throughout, so every value is exact.
  const StepDecision* d = decision_at(words.data());
  CHECK(d->sum_of_squares == 4 * 140);
  CHECK(d->grad_scale == 0.5f);  // no clipping: the unscale alone
  CHECK(d->finite == 1);
  CHECK(d->clipped == 0);
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
  // Each square is exact in float (a bf16 times 2^-10 squared has 16
  // significant bits); a lane of a 64-element chunk adds its even and odd
  // rows' squares once, in float: 2^-24 relative at most.
  CHECK(reference == doctest::Approx(naive).epsilon(0x1p-24));
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

// Note [float lanes, double fallback]: the float lanes' error bound, and the
// chunks they cannot sum, on every path (the vector loops of each
// instruction set for whole chunks of 256, the element loop for the rest).
TEST_CASE("float lanes: within their bound, and chunks that overflow or underflow float summed in double") {
  const Stream host = Stream::default_for(Device::host());
  const size_t chunk = 256;
  // A chunk's sum against its exact value: squares exact in double, added in
  // long double (64 significant bits; 256 terms of at most 48 bits whose
  // exponents span less than 2^16 lose nothing a float could see).
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(chunk * 7 + 100);
  for (float& x : f) x = normal(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 16) - 8);
  std::vector<bf16> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = bf16(f[i]);
  for (CpuIsa isa : supported_cpu_isas()) {
    ScopedCpuIsa force(isa);
    const std::string_view isa_name = cpu_isa_name(isa);
    CAPTURE(isa_name);
    for (float scale : {1.0f, 0.375f}) {
      CAPTURE(scale);
      const size_t chunks = (f.size() + chunk - 1) / chunk;
      std::vector<double> fs(chunks), bs(chunks);
      chunk_sums_of_squares(host, f.data(), DType::kFloat32, f.size(), chunk, scale, fs.data());
      chunk_sums_of_squares(host, b.data(), DType::kBFloat16, b.size(), chunk, scale, bs.data());
      for (size_t c = 0; c < chunks; ++c) {
        CAPTURE(c);
        long double want_f = 0, want_b = 0;
        for (size_t i = c * chunk; i < std::min(f.size(), c * chunk + chunk); ++i) {
          const double x = static_cast<double>(f[i] * scale), y = static_cast<double>(static_cast<float>(b[i]) * scale);
          want_f += x * x;
          want_b += y * y;
        }
        // A lane of a 256-element chunk adds 4 squares into each of its two
        // floats, then the two: at most 4 + 1 roundings of 2^-24 each, all
        // of non-negative terms, plus the tree's in double.
        const double bound = 5 * 0x1p-24 + 0x1p-48;
        CHECK(std::fabs(fs[c] - static_cast<double>(want_f)) <= bound * static_cast<double>(want_f));
        CHECK(std::fabs(bs[c] - static_cast<double>(want_b)) <= bound * static_cast<double>(want_b));
      }
    }

    // Squares above float's range: 2^70 squared is 2^140. The double lanes
    // give the exact 256 * 2^140; float lanes would give Inf.
    std::vector<bf16> huge(chunk * 3, bf16(std::ldexp(1.0f, 70)));
    std::vector<double> out(3);
    chunk_sums_of_squares(host, huge.data(), DType::kBFloat16, huge.size(), chunk, 1.0f, out.data());
    CHECK(out == std::vector<double>(3, std::ldexp(1.0, 148)));
    // Squares below float's smallest subnormal: (1 + 2^-7) * 2^-75 squared is
    // (1 + 2^-6 + 2^-14) * 2^-150, which float rounds to 2^-149 (or, scaled,
    // to nothing); the double lanes keep every bit.
    const float tiny = std::ldexp(1.0f + std::ldexp(1.0f, -7), -75);
    std::vector<bf16> small(chunk * 3, bf16(tiny));
    REQUIRE(static_cast<float>(small[0]) == tiny);
    chunk_sums_of_squares(host, small.data(), DType::kBFloat16, small.size(), chunk, 1.0f, out.data());
    const double exact_small = 256.0 * (1.0 + std::ldexp(1.0, -6) + std::ldexp(1.0, -14)) * std::ldexp(1.0, -150);
    CHECK(out == std::vector<double>(3, exact_small));
    // All zeros take the fallback too (0 is below its floor) and stay 0.
    std::vector<float> zeros(chunk * 2, 0.0f);
    chunk_sums_of_squares(host, zeros.data(), DType::kFloat32, zeros.size(), chunk, 1.0f, out.data());
    CHECK(out[0] == 0.0);
    CHECK(out[1] == 0.0);
    // Inf and NaN in a whole chunk of the vector loop: non-finite, as double
    // lanes keep them, and the chunks beside them untouched.
    std::vector<bf16> bad(chunk * 3, bf16(1.0f));
    bad[chunk + 17] = bf16::from_bits(0x7f80);  // Inf
    bad[2 * chunk + 200] = bf16::from_bits(0x7fc0);  // NaN
    chunk_sums_of_squares(host, bad.data(), DType::kBFloat16, bad.size(), chunk, 1.0f, out.data());
    CHECK(out[0] == 256.0);
    CHECK(std::isinf(out[1]));
    CHECK(std::isnan(out[2]));
  }
}
