// Note [16-byte vectors] (optim/vector_lanes.h): the lane order of a 16-byte
// word, the split of a run into whole vectors and a tail that the CUDA
// kernels loop with, and the alignment rule, on the host; and an update
// driven through them, eight elements at a time, with the bits of the
// optimizer's own host step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "zest/core/float16.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/detail/optimizer_impl.h"
#include "zest/optim/vector_lanes.h"

using namespace zest;
using namespace zest::detail;

TEST_CASE("lanes of a 16-byte word are the eight 16-bit elements in memory order") {
  fp16 values[kVecElems];
  for (unsigned k = 0; k < kVecElems; ++k) values[k] = fp16(static_cast<float>(k) + 0.5f);
  Lanes16 l{};
  static_assert(sizeof l == sizeof values);
  std::memcpy(&l, values, sizeof l);  // what a uint4 load reads
  for (unsigned k = 0; k < kVecElems; ++k) CHECK(lane16(l, k) == values[k].bits);

  Lanes16 built{};
  for (unsigned k = 0; k < kVecElems; ++k) set_lane16(built, k, values[kVecElems - 1 - k].bits);
  for (unsigned k = 0; k < kVecElems; ++k) set_lane16(built, k, values[k].bits);  // overwrites, not ORs
  CHECK(std::memcmp(&built, values, sizeof values) == 0);
}

TEST_CASE("for_each_vector visits every index once over any grid") {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{63}, size_t{64}, size_t{1000},
                   size_t{4099}}) {
    for (size_t threads : {size_t{1}, size_t{3}, size_t{256}, size_t{5000}}) {
      CAPTURE(n);
      CAPTURE(threads);
      std::vector<int> seen(n, 0);
      size_t vectors = 0;
      for (size_t t = 0; t < threads; ++t) {
        for_each_vector(
            n, t, threads,
            [&](size_t i) {
              CHECK(i % kVecElems == 0);
              REQUIRE(i + kVecElems <= n);
              ++vectors;
              for (size_t k = 0; k < kVecElems; ++k) ++seen[i + k];
            },
            [&](size_t i) {
              REQUIRE(i < n);
              CHECK(i >= n / kVecElems * kVecElems);
              ++seen[i];
            });
      }
      CHECK(vectors == n / kVecElems);
      for (size_t i = 0; i < n; ++i) CHECK(seen[i] == 1);
    }
    // vector_threads: enough threads that each does at most one vector and
    // one tail element.
    CHECK(vector_threads(n) >= n / kVecElems);
    CHECK(vector_threads(n) >= n % kVecElems);
  }
}

TEST_CASE("vector_aligned: every non-null pointer on a 16-byte boundary") {
  alignas(16) float buf[16] = {};
  CHECK(vector_aligned({buf, buf + 4, nullptr}));
  CHECK_FALSE(vector_aligned({buf, buf + 1}));
  CHECK_FALSE(vector_aligned({reinterpret_cast<const char*>(buf) + 8}));
  CHECK(vector_aligned({}));
}

TEST_CASE("an AdamW step eight lanes at a time has the bits of the host step") {
  // bf16 gradients and a bf16 parameter copy, read and written through the
  // lanes as the CUDA kernel's load8/store8 do; n leaves a tail of 5.
  constexpr size_t n = 1021;
  std::vector<bf16> g(n);
  std::vector<float> w(n), m(n, 0.0f), v(n, 0.0f);
  for (size_t i = 0; i < n; ++i) {
    g[i] = bf16(std::sin(0.37f * static_cast<float>(i)) * 2.0f);
    w[i] = std::cos(0.11f * static_cast<float>(i));
  }
  OptimizerConfig c;
  const StepScalars k{0.01f, 0.1f, 3, 0.5f};
  std::vector<float> hw = w, hm = m, hv = v;
  std::vector<bf16> hout(n);
  const ShardBuffers hs{hw.data(), DType::kFloat32, {hm.data(), hv.data()}, DType::kFloat32, g.data(), DType::kBFloat16, hout.data(), DType::kBFloat16, n};
  optimizer_step(Stream::default_for(Device::host()), c, hs, k);

  const AdamStep a = adam_step(c, k);
  std::vector<bf16> out(n);
  const auto one = [&](size_t i) {
    adam_update(a, static_cast<float>(g[i]), w[i], m[i], v[i]);
    out[i] = bf16(w[i]);
  };
  const auto eight = [&](size_t i) {
    Lanes16 in{};
    std::memcpy(&in, g.data() + i, sizeof in);
    Lanes16 o{};
    for (unsigned l = 0; l < kVecElems; ++l) {
      adam_update(a, bf16_bits_to_float(lane16(in, l)), w[i + l], m[i + l], v[i + l]);
      set_lane16(o, l, bf16(w[i + l]).bits);
    }
    std::memcpy(static_cast<void*>(out.data() + i), &o, sizeof o);
  };
  for (size_t t = 0; t < 7; ++t) for_each_vector(n, t, 7, eight, one);
  CHECK(std::memcmp(w.data(), hw.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(m.data(), hm.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(v.data(), hv.data(), n * sizeof(float)) == 0);
  CHECK(std::memcmp(out.data(), hout.data(), n * sizeof(bf16)) == 0);
}
