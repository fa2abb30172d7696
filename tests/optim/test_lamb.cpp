// LAMB (optim/lamb.h): hand-computed steps of tiny parameters (the trust
// ratio clamped at max_coeff and min_coeff, zero norms, weight decay,
// eps_inside_sqrt, bias correction), a double-precision reference of
// DeepSpeed's formula over several steps, pieces that do not depend on
// where a shard starts, skipped steps and the checks.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/float16.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/lamb.h"
#include "zest/optim/detail/lamb_impl.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/step_decision.h"

using namespace zest;

namespace {

const Stream kHost = Stream::default_for(Device::host());

OptimizerConfig lamb_config() {
  OptimizerConfig c;
  c.kind = OptimizerKind::kLamb;
  c.lr = 0.25f;
  c.beta1 = 0.5f;
  c.beta2 = 0.75f;
  c.eps = 1.0f;
  c.bias_correction = false;
  c.weight_decay = 0.0f;
  return c;
}

// One tensor's state and a whole-tensor LAMB step of it on the host:
// moments, exact sums, ratio, apply, as the engine runs them.
struct Tensor {
  std::vector<float> w, m, v, g;
  explicit Tensor(std::vector<float> weights, std::vector<float> grads)
      : w(std::move(weights)), m(w.size()), v(w.size()), g(std::move(grads)) {}

  ShardBuffers buffers() {
    ShardBuffers s;
    s.master = w.data();
    s.state[0] = m.data();
    s.state[1] = v.data();
    s.grad = g.data();
    s.numel = w.size();
    return s;
  }

  // Returns the trust ratio the step used.
  float step(const OptimizerConfig& c, int64_t t, float weight_decay = 0.0f, const StepScalars* with = nullptr) {
    std::vector<LambPiece> pieces;
    lamb_pieces(pieces, 0, w.size(), 0, 0);
    StepScalars k;
    k.lr = c.lr;
    k.weight_decay = weight_decay;
    k.step = t;
    if (with != nullptr) k = *with;
    std::vector<double> sums(2 * pieces.size());
    std::vector<int64_t> words(2 * kExactWords);
    float ratio = 0.0f;
    lamb_moments(kHost, c, buffers(), k, pieces.data(), pieces.size(), sums.data());
    lamb_accumulate(kHost, pieces.data(), sums.data(), pieces.size(), 1, words.data());
    lamb_trust_ratios(kHost, c, words.data(), 1, &ratio);
    lamb_apply(kHost, c, buffers(), k, pieces.data(), pieces.size(), &ratio);
    return ratio;
  }
};

}  // namespace

// With beta1 0.5, beta2 0.75, eps 1 and gradients of 2: m = 1, v = 1,
// u = 1 / (sqrt(1) + 1) = 0.5 per element, ||u|| = sqrt(0.5 n). No bias
// correction: the step size is lr = 0.25. Every value below is exact.
TEST_CASE("LAMB by hand: the trust ratio clamped at max_coeff") {
  Tensor t({30.0f, 40.0f}, {2.0f, 2.0f});  // ||w|| = 50, ||u|| = 0.707: 70.7 -> 10
  CHECK(t.step(lamb_config(), 1) == 10.0f);
  CHECK(t.m == std::vector<float>{1.0f, 1.0f});
  CHECK(t.v == std::vector<float>{1.0f, 1.0f});
  CHECK(t.w == std::vector<float>{30.0f - 1.25f, 40.0f - 1.25f});  // lr * 10 * 0.5
}

TEST_CASE("LAMB by hand: the trust ratio clamped at min_coeff") {
  Tensor t({0.003f, 0.004f}, {2.0f, 2.0f});  // ||w|| = 0.005: 0.00707 -> 0.01
  CHECK(t.step(lamb_config(), 1) == 0.01f);
  const float scale = 0.25f * 0.01f;
  CHECK(t.w == std::vector<float>{0.003f - scale * 0.5f, 0.004f - scale * 0.5f});
}

TEST_CASE("LAMB by hand: a ratio inside the bounds is ||w|| / ||u||, rounded once to float") {
  Tensor t({3.0f, 4.0f}, {2.0f, 2.0f});
  const auto ratio = static_cast<float>(5.0 / std::sqrt(0.5));
  CHECK(t.step(lamb_config(), 1) == ratio);
  CHECK(t.w == std::vector<float>{3.0f - (0.25f * ratio) * 0.5f, 4.0f - (0.25f * ratio) * 0.5f});
}

TEST_CASE("LAMB by hand: a zero norm of w or of u gives the ratio 1") {
  Tensor zero_w({0.0f, 0.0f}, {2.0f, 2.0f});
  CHECK(zero_w.step(lamb_config(), 1) == 1.0f);
  CHECK(zero_w.w == std::vector<float>{-0.125f, -0.125f});  // lr * 1 * 0.5
  Tensor zero_u({3.0f, 4.0f}, {0.0f, 0.0f});  // no gradient, no decay: u = 0
  CHECK(zero_u.step(lamb_config(), 1) == 1.0f);
  CHECK(zero_u.w == std::vector<float>{3.0f, 4.0f});
  // The function itself: either norm 0 is 1, whatever the bounds say.
  CHECK(detail::lamb_trust_ratio(0.0, 0.0, 0.5f, 2.0f) == 1.0f);
  CHECK(detail::lamb_trust_ratio(25.0, 0.0, 0.5f, 2.0f) == 1.0f);
  CHECK(detail::lamb_trust_ratio(0.0, 4.0, 0.5f, 2.0f) == 1.0f);
  CHECK(detail::lamb_trust_ratio(36.0, 4.0, 0.5f, 2.0f) == 2.0f);   // 3 -> max
  CHECK(detail::lamb_trust_ratio(1.0, 16.0, 0.5f, 2.0f) == 0.5f);   // 0.25 -> min
  CHECK(detail::lamb_trust_ratio(2.25, 1.0, 0.5f, 2.0f) == 1.5f);   // inside
}

TEST_CASE("LAMB by hand: weight decay is added to the update before the ratio") {
  Tensor t({3.0f, 4.0f}, {2.0f, 2.0f});
  // u = 0.5 + 0.5 w = [2, 2.5]; ||u||^2 = 10.25
  const auto ratio = static_cast<float>(5.0 / std::sqrt(10.25));
  CHECK(t.step(lamb_config(), 1, 0.5f) == ratio);
  const float scale = 0.25f * ratio;
  CHECK(t.w == std::vector<float>{3.0f - scale * 2.0f, 4.0f - scale * 2.5f});
}

TEST_CASE("LAMB by hand: eps_inside_sqrt takes sqrt(v + eps)") {
  OptimizerConfig c = lamb_config();
  c.eps_inside_sqrt = true;
  Tensor t({30.0f, 40.0f}, {2.0f, 2.0f});
  CHECK(t.step(c, 1) == 10.0f);  // u = 1 / sqrt(2): ||u|| = 1, ratio 50 -> 10
  const float u = 1.0f / std::sqrt(2.0f);
  CHECK(t.w == std::vector<float>{30.0f - 2.5f * u, 40.0f - 2.5f * u});
}

TEST_CASE("LAMB: bias correction is all in the step size, as DeepSpeed computes it") {
  OptimizerConfig c = lamb_config();
  c.bias_correction = true;
  StepScalars k;
  k.lr = 0.25f;
  k.step = 2;
  // 1 - 0.5^2 = 0.75, 1 - 0.75^2 = 0.4375: lr * sqrtf(0.4375) / 0.75 in float.
  CHECK(detail::lamb_step(c, k).step_size == 0.25f * std::sqrt(0.4375f) / 0.75f);
  k.step = 1;  // 0.5 and 0.25: sqrt(0.25) / 0.5 = 1
  CHECK(detail::lamb_step(c, k).step_size == 0.25f);
  c.bias_correction = false;
  k.step = 7;
  CHECK(detail::lamb_step(c, k).step_size == 0.25f);
}

namespace {

// DeepSpeed's formula in double, one tensor at a time: the reference.
struct Reference {
  std::vector<double> w, m, v;
  void step(const OptimizerConfig& c, const std::vector<float>& g, double wd, int64_t t) {
    const double b1 = c.beta1, b2 = c.beta2, eps = c.eps;
    double step_size = c.lr;
    if (c.bias_correction) {
      step_size = c.lr * std::sqrt(1.0 - std::pow(b2, t)) / (1.0 - std::pow(b1, t));
    }
    std::vector<double> u(w.size());
    double wn = 0.0, un = 0.0;
    for (size_t i = 0; i < w.size(); ++i) {
      m[i] = b1 * m[i] + (1.0 - b1) * g[i];
      v[i] = b2 * v[i] + (1.0 - b2) * g[i] * g[i];
      const double denom = c.eps_inside_sqrt ? std::sqrt(v[i] + eps) : std::sqrt(v[i]) + eps;
      u[i] = m[i] / denom + wd * w[i];
      wn += w[i] * w[i];
      un += u[i] * u[i];
    }
    double r = 1.0;
    if (wn != 0.0 && un != 0.0) r = std::min<double>(c.max_coeff, std::max<double>(c.min_coeff, std::sqrt(wn / un)));
    for (size_t i = 0; i < w.size(); ++i) w[i] -= step_size * r * u[i];
  }
};

float pseudo(size_t i, int salt) {
  const double x = std::sin(static_cast<double>(i) * 12.9898 + salt * 78.233) * 43758.5453;
  return static_cast<float>(x - std::floor(x)) - 0.5f;
}

}  // namespace

TEST_CASE("LAMB agrees with a double-precision reference of DeepSpeed's formula to 1e-6 over 6 steps") {
  for (const bool bias : {true, false}) {
    for (const bool inside : {false, true}) {
      CAPTURE(bias);
      CAPTURE(inside);
      OptimizerConfig c;
      c.kind = OptimizerKind::kLamb;
      c.lr = 0.01f;
      c.bias_correction = bias;
      c.eps_inside_sqrt = inside;
      c.max_coeff = 10.0f;
      c.min_coeff = 0.01f;
      const size_t n = 1000;  // four pieces, the last short
      std::vector<float> w0(n);
      for (size_t i = 0; i < n; ++i) w0[i] = 0.2f * pseudo(i, 1);
      Tensor t(w0, std::vector<float>(n));
      Reference ref{std::vector<double>(w0.begin(), w0.end()), std::vector<double>(n), std::vector<double>(n)};
      for (int64_t step = 1; step <= 6; ++step) {
        for (size_t i = 0; i < n; ++i) t.g[i] = pseudo(i, static_cast<int>(step) + 10);
        t.step(c, step, 0.01f);
        ref.step(c, t.g, static_cast<double>(0.01f), step);
      }
      double worst = 0.0;
      for (size_t i = 0; i < n; ++i) {
        worst = std::max(worst, std::abs(t.w[i] - ref.w[i]) / std::max(1e-3, std::abs(ref.w[i])));
      }
      CAPTURE(worst);
      CHECK(worst < 1e-6);
      // The weights moved by far more than the tolerance.
      CHECK(std::abs(t.w[0] - w0[0]) > 1e-4);
    }
  }
}

TEST_CASE("LAMB's pieces: cut at the multiples of 256 from the shard's start, relative to the base") {
  std::vector<LambPiece> p;
  lamb_pieces(p, 100, 700, 64, 3);
  REQUIRE(p.size() == 3);
  CHECK((p[0].begin == 36 && p[0].numel == 156 && p[0].param == 3));  // [100, 256)
  CHECK((p[1].begin == 192 && p[1].numel == 256));                      // [256, 512)
  CHECK((p[2].begin == 448 && p[2].numel == 188));                      // [512, 700)
  p.clear();
  lamb_pieces(p, 5, 5, 0, 0);
  CHECK(p.empty());
  CHECK_THROWS_WITH_AS(lamb_pieces(p, 3, 10, 4, 0), doctest::Contains("is not a range past the base"), Error);
}

TEST_CASE("LAMB: a parameter split across two shards gets the ratio and bits of the whole") {
  // One parameter of 700 elements from offset 64 of a flat buffer of 1024,
  // stepped whole, then as two shards of 512 (the second starting inside
  // it): the same weights, bit for bit.
  const size_t flat = 1024, off = 64, numel = 700;
  std::vector<float> w0(flat, 0.0f), g(flat, 0.0f);
  for (size_t i = off; i < off + numel; ++i) {
    w0[i] = pseudo(i, 3);
    g[i] = pseudo(i, 4);
  }
  OptimizerConfig c = lamb_config();
  c.eps = 1e-6f;
  c.bias_correction = true;
  StepScalars k;
  k.lr = 0.01f;
  k.weight_decay = 0.1f;
  for (const size_t shard : {flat, flat / 2, flat / 4}) {
    CAPTURE(shard);
    Tensor whole(std::vector<float>(w0.begin() + off, w0.begin() + off + numel),
                 std::vector<float>(g.begin() + off, g.begin() + off + numel));
    Tensor sharded(w0, g);
    for (int64_t step = 1; step <= 3; ++step) {
      k.step = step;
      (void)whole.step(c, step, k.weight_decay, &k);
      std::vector<int64_t> words(2 * kExactWords);
      std::vector<std::vector<LambPiece>> pieces(flat / shard);
      std::vector<std::vector<double>> sums(flat / shard);
      for (size_t s = 0; s < flat / shard; ++s) {
        const size_t lo = std::max(off, s * shard), hi = std::min(off + numel, (s + 1) * shard);
        if (lo < hi) lamb_pieces(pieces[s], lo - s * shard, hi - s * shard, 0, 0);
        sums[s].resize(2 * pieces[s].size());
        const ShardBuffers b = sharded.buffers().part(s * shard, shard);
        lamb_moments(kHost, c, b, k, pieces[s].data(), pieces[s].size(), sums[s].data());
        std::vector<int64_t> mine(2 * kExactWords);
        lamb_accumulate(kHost, pieces[s].data(), sums[s].data(), pieces[s].size(), 1, mine.data());
        for (size_t i = 0; i < words.size(); ++i) words[i] += mine[i];  // the all-reduce
      }
      float ratio = 0.0f;
      lamb_trust_ratios(kHost, c, words.data(), 1, &ratio);
      for (size_t s = 0; s < flat / shard; ++s) {
        lamb_apply(kHost, c, sharded.buffers().part(s * shard, shard), k, pieces[s].data(), pieces[s].size(), &ratio);
      }
    }
    CHECK(std::memcmp(whole.w.data(), sharded.w.data() + off, numel * sizeof(float)) == 0);
    CHECK(std::memcmp(whole.m.data(), sharded.m.data() + off, numel * sizeof(float)) == 0);
    CHECK(std::memcmp(whole.v.data(), sharded.v.data() + off, numel * sizeof(float)) == 0);
    CHECK(whole.w[0] != w0[off]);
  }
}

TEST_CASE("LAMB: fp16 gradients and an fp16 copy of the weights, a skipped step changes nothing") {
  OptimizerConfig c = lamb_config();
  Tensor t({30.0f, 40.0f}, {});
  const std::vector<fp16> g16 = {fp16(2.0f), fp16(2.0f)};
  std::vector<fp16> out(2);
  std::vector<LambPiece> pieces;
  lamb_pieces(pieces, 0, 2, 0, 0);
  ShardBuffers s = t.buffers();
  s.grad = g16.data();
  s.grad_dtype = DType::kFloat16;
  s.param_out = out.data();
  s.param_dtype = DType::kFloat16;
  StepScalars k;
  k.lr = 0.25f;
  // A skipped step (as decide_step writes it): nothing is read or written.
  StepDecision skip;
  skip.finite = 0;
  k.decision = &skip;
  double sums[2] = {-1.0, -1.0};
  lamb_moments(kHost, c, s, k, pieces.data(), 1, sums);
  const float ten = 10.0f;
  lamb_apply(kHost, c, s, k, pieces.data(), 1, &ten);
  CHECK(sums[0] == -1.0);
  CHECK(t.w == std::vector<float>{30.0f, 40.0f});
  CHECK(t.m == std::vector<float>{0.0f, 0.0f});
  // Applied, with the decision's gradient scale (0.5: the gradients are 1).
  StepDecision go;
  go.grad_scale = 0.5f;
  k.decision = &go;
  lamb_moments(kHost, c, s, k, pieces.data(), 1, sums);
  CHECK(t.m == std::vector<float>{0.5f, 0.5f});
  CHECK(sums[0] == 2500.0);
  lamb_apply(kHost, c, s, k, pieces.data(), 1, &ten);
  CHECK(t.w[0] == 30.0f - 2.5f * (0.5f / (std::sqrt(0.25f) + 1.0f)));
  CHECK(static_cast<float>(out[0]) == static_cast<float>(fp16(t.w[0])));
  CHECK(static_cast<float>(out[1]) == static_cast<float>(fp16(t.w[1])));
}

TEST_CASE("LAMB: misuse is refused by name") {
  OptimizerConfig c = lamb_config();
  Tensor t({1.0f}, {1.0f});
  CHECK_THROWS_WITH_AS(optimizer_step(kHost, c, t.buffers(), StepScalars{0.1f, 0.0f, 1, 1.0f}),
                       doctest::Contains("Lamb's trust ratio needs the norms of whole parameters"), Error);
  std::vector<LambPiece> pieces;
  lamb_pieces(pieces, 0, 1, 0, 5);
  double sums[2] = {1.0, 1.0};
  std::vector<int64_t> words(4 * kExactWords);  // two parameters' words
  CHECK_THROWS_WITH_AS(lamb_accumulate(kHost, pieces.data(), sums, 1, 2, words.data()),
                       doctest::Contains("piece 0 names parameter 5 of 2"), Error);
  OptimizerConfig adam;
  CHECK_THROWS_WITH_AS(lamb_moments(kHost, adam, t.buffers(), StepScalars{}, pieces.data(), 1, sums),
                       doctest::Contains("the optimizer is AdamW, not Lamb"), Error);
  c.min_coeff = 0.0f;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("Lamb: min_coeff must be a positive number, got 0"), Error);
  c = lamb_config();
  c.max_coeff = 1e30f;
  CHECK_THROWS_WITH_AS(check_learning_rate(c, 1e10, 0.0f, "set_lr(1e10)"),
                       doctest::Contains("with the bias correction of the first step and max_coeff"), Error);
  CHECK_NOTHROW(check_learning_rate(lamb_config(), 1.0, 0.0f, "set_lr(1)"));
}
