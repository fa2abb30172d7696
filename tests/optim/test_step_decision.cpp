// The step decision (optim/step_decision.h): norm, skip and clip coefficient
// decided from the exact words, as the engine used to decide them on the
// host, and an optimizer step that follows a decision in memory.
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "zest/optim/exact_sum.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/step_decision.h"

namespace test_step_decision {

using namespace zest;

namespace {

using Words = std::array<int64_t, kExactWords>;

Words words_of(const std::vector<double>& values) {
  Words w{};
  for (double v : values) REQUIRE(exact_add(w.data(), v));
  exact_normalize(w.data());
  return w;
}

Stream host() { return Stream::default_for(Device::host()); }

// What Engine::step computed on the host before the decision moved.
struct Expected {
  double norm;
  bool finite;
  bool clipped;
  float grad_scale;
};
Expected host_rule(double sumsq, double unscale, double max_norm) {
  Expected e{std::sqrt(sumsq), std::isfinite(sumsq), false, 0.0f};
  double coef = 1.0;
  if (max_norm > 0.0) {
    const double c = max_norm / (e.norm + 1e-6);
    if (c < 1.0) {
      coef = c;
      e.clipped = true;
    }
  }
  e.grad_scale = static_cast<float>(unscale * coef);
  return e;
}

}  // namespace

TEST_CASE("decide: the norm, the clip coefficient and the scale, as the host rule had them") {
  const std::vector<std::vector<double>> sums = {{0.0}, {0.25, 1e-30}, {9.0, 16.0}, {1e10, 3.0}, {1e-20}};
  for (const auto& values : sums) {
    for (const double unscale : {1.0, 1.0 / 3.0, 1.0 / 65536.0}) {
      for (const double max_norm : {0.0, 1.0, 5.0, 1e6}) {
        CAPTURE(values[0]);
        CAPTURE(unscale);
        CAPTURE(max_norm);
        const Words w = words_of(values);
        const StepDecision d = decide(w.data(), unscale, max_norm);
        const Expected e = host_rule(exact_value(w.data()), unscale, max_norm);
        CHECK(d.sum_of_squares == exact_value(w.data()));
        CHECK(d.finite == 1);
        CHECK(d.clipped == (e.clipped ? 1 : 0));
        CHECK(std::memcmp(&d.grad_scale, &e.grad_scale, sizeof(float)) == 0);
      }
    }
  }
  // 9 + 16 = 25: a norm of 5 clipped to 1 scales by 1 / (5 + 1e-6).
  const Words w = words_of({9.0, 16.0});
  const StepDecision d = decide(w.data(), 1.0, 1.0);
  CHECK(d.sum_of_squares == 25.0);
  CHECK(d.clipped == 1);
  CHECK(d.grad_scale == static_cast<float>(1.0 / (5.0 + 1e-6)));
  CHECK(decide(w.data(), 1.0, 5.0).clipped == 1);  // 5 / (5 + 1e-6) is below 1, if only just
  CHECK(decide(w.data(), 1.0, 6.0).clipped == 0);
}

TEST_CASE("decide: Inf and NaN skip the step and never clip") {
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const double bad : {inf, nan}) {
    const Words w = words_of({1.0, bad});
    const StepDecision d = decide(w.data(), 1.0, 1.0);
    CHECK(d.finite == 0);
    CHECK(d.clipped == 0);
    CHECK_FALSE(std::isfinite(d.sum_of_squares));
    CHECK(std::isnan(d.sum_of_squares) == std::isnan(bad));
  }
}

TEST_CASE("decide_step writes the decision over the words it read") {
  Words w = words_of({9.0, 16.0});
  decide_step(host(), w.data(), 0.5, 1.0);
  StepDecision d;
  std::memcpy(&d, decision_at(w.data()), sizeof d);
  CHECK(d.sum_of_squares == 25.0);
  CHECK(d.finite == 1);
  CHECK(d.clipped == 1);
  CHECK(d.grad_scale == static_cast<float>(0.5 * (1.0 / (5.0 + 1e-6))));
}

TEST_CASE("an optimizer step follows a decision: skipped when not finite, else its scale") {
  constexpr size_t n = 300;
  std::vector<float> g(n), w0(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = std::sin(static_cast<float>(i)) * 3.0f;
    w0[i] = std::cos(static_cast<float>(i));
  }
  OptimizerConfig c;  // AdamW
  auto run = [&](const StepScalars& k) {
    std::vector<float> w = w0, m(n, 0.0f), v(n, 0.0f);
    ShardBuffers s{w.data(), DType::kFloat32, {m.data(), v.data()}, DType::kFloat32, g.data(), DType::kFloat32, nullptr, DType::kFloat32, n};
    optimizer_step(host(), c, s, k);
    return w;
  };
  StepScalars plain{0.01f, 0.1f, 1, 0.25f};
  Words words = words_of({9.0, 16.0});
  decide_step(host(), words.data(), 0.25, 0.0);  // no clipping: the scale is 0.25
  StepScalars decided{0.01f, 0.1f, 1, 123.0f};     // grad_scale ignored
  decided.decision = decision_at(words.data());
  const std::vector<float> a = run(plain), b = run(decided);
  CHECK(std::memcmp(a.data(), b.data(), n * sizeof(float)) == 0);
  CHECK(a != w0);

  Words bad = words_of({std::numeric_limits<double>::infinity()});
  decide_step(host(), bad.data(), 1.0, 0.0);
  StepScalars skipped = plain;
  skipped.decision = decision_at(bad.data());
  CHECK(run(skipped) == w0);  // untouched
}

}  // namespace test_step_decision
