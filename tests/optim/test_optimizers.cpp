// Each optimizer against a plain double-precision reference written here,
// over several steps at an odd size, for every gradient and parameter dtype.
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "zest/core/check.h"
#include "zest/optim/optimizer.h"

using namespace zest;

namespace {

constexpr size_t kN = 2789;  // odd, and not a multiple of any vector width

struct Reference {
  std::vector<double> w, m, v;
};

// torch.optim.AdamW / Adam, step t (1-based).
void adam_reference(Reference& r, const std::vector<double>& g_in, const OptimizerConfig& c, double lr,
                    double wd, int t) {
  for (size_t i = 0; i < r.w.size(); ++i) {
    double g = g_in[i];
    if (c.kind == OptimizerKind::kAdamW) {
      r.w[i] -= lr * wd * r.w[i];
    } else {
      g += wd * r.w[i];
    }
    r.m[i] = c.beta1 * r.m[i] + (1 - c.beta1) * g;
    r.v[i] = c.beta2 * r.v[i] + (1 - c.beta2) * g * g;
    const double mhat = r.m[i] / (1 - std::pow(double(c.beta1), t));
    const double vhat = r.v[i] / (1 - std::pow(double(c.beta2), t));
    r.w[i] -= lr * mhat / (std::sqrt(vhat) + c.eps);
  }
}

// torch.optim.SGD, step t (1-based).
void sgd_reference(Reference& r, const std::vector<double>& g_in, const OptimizerConfig& c, double lr,
                   double wd, int t) {
  for (size_t i = 0; i < r.w.size(); ++i) {
    double g = g_in[i] + wd * r.w[i];
    if (c.momentum != 0) {
      r.m[i] = t == 1 ? g : c.momentum * r.m[i] + (1 - c.dampening) * g;
      g = c.nesterov ? g + c.momentum * r.m[i] : r.m[i];
    }
    r.w[i] -= lr * g;
  }
}

template <typename T>
std::vector<T> to_storage(const std::vector<double>& x) {
  std::vector<T> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = T(static_cast<float>(x[i]));
  return out;
}

template <typename TG, typename TP>
void run_case(const OptimizerConfig& c) {
  std::mt19937 rng(7);
  std::normal_distribution<double> normal(0.0, 1.0);
  Reference ref;
  ref.w.resize(kN);
  ref.m.assign(kN, 0.0);
  ref.v.assign(kN, 0.0);
  for (double& w : ref.w) w = static_cast<float>(normal(rng));  // start from float-exact values
  std::vector<float> master(ref.w.begin(), ref.w.end()), s0(kN, 0.0f), s1(kN, 0.0f);
  std::vector<TP> out(kN);
  const float grad_scale = 0.25f;  // e.g. 1 / (loss scale 4), exact
  const float lr = 0.01f;
  const float wd = 0.1f;
  for (int t = 1; t <= 5; ++t) {
    std::vector<double> g(kN);
    for (double& x : g) x = normal(rng) * 4.0;
    const std::vector<TG> stored = to_storage<TG>(g);
    std::vector<double> seen(kN);  // what the optimizer sees: stored value x scale
    for (size_t i = 0; i < kN; ++i) seen[i] = static_cast<double>(static_cast<float>(stored[i])) * grad_scale;

    ShardBuffers s;
    s.master = master.data();
    s.state[0] = s0.data();
    s.state[1] = s1.data();
    s.grad = stored.data();
    s.grad_dtype = dtype_of_v<TG>;
    s.param_out = out.data();
    s.param_dtype = dtype_of_v<TP>;
    s.numel = kN;
    optimizer_step(Stream::default_for(Device::host()), c, s, StepScalars{lr, wd, t, grad_scale});
    if (c.kind == OptimizerKind::kSgd) {
      sgd_reference(ref, seen, c, lr, wd, t);
    } else {
      adam_reference(ref, seen, c, lr, wd, t);
    }
  }
  double err2 = 0;
  double ref2 = 0;
  double max_abs = 0;
  for (size_t i = 0; i < kN; ++i) {
    const double err = std::fabs(master[i] - ref.w[i]);
    err2 += err * err;
    ref2 += ref.w[i] * ref.w[i];
    max_abs = std::max(max_abs, err);
    // The output copy is the master weight rounded once to the parameter dtype.
    REQUIRE(static_cast<float>(out[i]) == static_cast<float>(TP(master[i])));
  }
  // Float arithmetic over five steps of about ten operations each, on weights
  // of order 1 (an ulp is 1.2e-7 there): a wrong formula (bias correction,
  // decay, momentum) is off by 1e-4 or more.
  CHECK(std::sqrt(err2 / ref2) < 3e-7);
  CHECK(max_abs < 2e-6);
}

template <typename TG, typename TP>
void run_all_optimizers() {
  OptimizerConfig adamw;
  run_case<TG, TP>(adamw);
  OptimizerConfig adam = adamw;
  adam.kind = OptimizerKind::kAdam;
  run_case<TG, TP>(adam);
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  run_case<TG, TP>(sgd);
  sgd.momentum = 0.9f;
  run_case<TG, TP>(sgd);
  sgd.dampening = 0.1f;
  run_case<TG, TP>(sgd);
  sgd.dampening = 0.0f;
  sgd.nesterov = true;
  run_case<TG, TP>(sgd);
}

}  // namespace

TEST_CASE("optimizers match the reference with fp32 gradients and parameters") {
  run_all_optimizers<float, float>();
}
TEST_CASE("optimizers match the reference with bf16 gradients and parameters") {
  run_all_optimizers<bf16, bf16>();
}
TEST_CASE("optimizers match the reference with fp16 gradients and parameters") {
  run_all_optimizers<fp16, fp16>();
}
TEST_CASE("optimizers match the reference with fp16 gradients and fp32 parameters") {
  run_all_optimizers<fp16, float>();
}

TEST_CASE("AdamW and Adam differ exactly by where weight decay enters") {
  // With zero gradients, AdamW only decays the weight; Adam's L2 term enters
  // the moments and moves the weight by about lr.
  float w1 = 2.0f, w2 = 2.0f, m1 = 0, v1 = 0, m2 = 0, v2 = 0;
  const float g = 0.0f;
  OptimizerConfig adamw;
  OptimizerConfig adam;
  adam.kind = OptimizerKind::kAdam;
  const Stream s = Stream::default_for(Device::host());
  optimizer_step(s, adamw, ShardBuffers{&w1, DType::kFloat32, {&m1, &v1}, DType::kFloat32, &g, DType::kFloat32, nullptr, DType::kFloat32, 1},
                 StepScalars{0.1f, 0.5f, 1, 1.0f});
  optimizer_step(s, adam, ShardBuffers{&w2, DType::kFloat32, {&m2, &v2}, DType::kFloat32, &g, DType::kFloat32, nullptr, DType::kFloat32, 1},
                 StepScalars{0.1f, 0.5f, 1, 1.0f});
  CHECK(w1 == doctest::Approx(2.0f * (1.0f - 0.1f * 0.5f)).epsilon(1e-7));
  CHECK(w2 == doctest::Approx(2.0f - 0.1f).epsilon(1e-6));
}

TEST_CASE("bad optimizer settings and buffers are refused with the setting's name") {
  OptimizerConfig c;
  c.beta2 = 1.0f;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("AdamW: betas[1] must be in [0, 1), got 1"), Error);
  c = OptimizerConfig{};
  c.lr = NAN;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("lr must be a finite number"), Error);
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.nesterov = true;
  CHECK_THROWS_WITH_AS(sgd.validate(), doctest::Contains("nesterov needs momentum > 0"), Error);
  CHECK(sgd.state_buffers() == 0);
  CHECK(OptimizerConfig{}.state_buffers() == 2);

  float w = 0;
  int32_t gi = 0;
  const Stream s = Stream::default_for(Device::host());
  CHECK_THROWS_WITH_AS(optimizer_step(s, OptimizerConfig{}, ShardBuffers{&w, DType::kFloat32, {&w, nullptr}, DType::kFloat32, &w, DType::kFloat32, nullptr, DType::kFloat32, 1},
                                      StepScalars{}),
                       doctest::Contains("state buffer 1 must not be null"), Error);
  float m = 0, v = 0;
  CHECK_THROWS_WITH_AS(optimizer_step(s, OptimizerConfig{}, ShardBuffers{&w, DType::kFloat32, {&m, &v}, DType::kFloat32, &gi, DType::kInt32, nullptr, DType::kFloat32, 1},
                                      StepScalars{}),
                       doctest::Contains("gradients of dtype int32 are not supported"), Error);
  CHECK_THROWS_WITH_AS(optimizer_step(s, OptimizerConfig{}, ShardBuffers{&w, DType::kFloat32, {&m, &v}, DType::kFloat32, &w, DType::kFloat32, nullptr, DType::kFloat32, 1},
                                      StepScalars{0.1f, 0, 0, 1}),
                       doctest::Contains("step must count from 1"), Error);
}
