// The dynamic loss scale follows DeepSpeed's schedule step by step.
#include <doctest/doctest.h>

#include <vector>

#include "zest/core/check.h"
#include "zest/optim/loss_scaler.h"

using namespace zest;

namespace {

// Runs a script of overflow flags; returns the scale after each update.
std::vector<double> run(LossScalerConfig cfg, const std::vector<int>& overflows) {
  LossScaler s(cfg);
  std::vector<double> scales;
  for (int o : overflows) {
    s.update(o != 0);
    scales.push_back(s.scale());
  }
  return scales;
}

}  // namespace

TEST_CASE("a static loss scale that overflows every fp16 gradient is refused (issue 12)") {
  LossScalerConfig c;
  c.dynamic = false;
  c.static_scale = 1e38;
  CHECK_THROWS_WITH_AS(LossScaler{c},
                       doctest::Contains("fp16.loss_scale is 1e+38: a static loss scale above 1.099e+12 (65504 / "
                                         "2^-24) overflows every gradient fp16 can hold"),
                       Error);
  c.static_scale = kMaxStaticLossScale;
  CHECK(LossScaler(c).scale() == kMaxStaticLossScale);
}

TEST_CASE("defaults: 2^16, hysteresis 2, doubling after a clean window") {
  LossScaler s;
  CHECK(s.scale() == 65536.0);
  LossScalerConfig cfg;
  cfg.window = 4;
  // Overflow at iteration 0 uses up one unit of hysteresis; the second halves
  // the scale. Iteration 1 was the last overflow, so iterations 2..5 are the
  // clean window and the scale doubles on the update at iteration 6.
  const std::vector<double> got = run(cfg, {1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  const std::vector<double> want = {65536, 32768, 32768, 32768, 32768, 32768,
                                    65536, 65536, 65536, 65536, 131072};
  CHECK(got == want);
}

TEST_CASE("hysteresis is restored only by a doubling unless consecutive") {
  LossScalerConfig cfg;
  cfg.window = 3;
  cfg.hysteresis = 2;
  // Overflow (tolerated), clean step, overflow: the tolerance is still spent,
  // so the second overflow halves.
  CHECK(run(cfg, {1, 0, 1}) == std::vector<double>{65536, 65536, 32768});
  cfg.consecutive_hysteresis = true;
  // With consecutive hysteresis the clean step refills it: tolerated again.
  CHECK(run(cfg, {1, 0, 1}) == std::vector<double>{65536, 65536, 65536});
}

TEST_CASE("hysteresis 1 halves at every overflow, down to the minimum, then stops the run") {
  LossScalerConfig cfg;
  cfg.initial_scale_power = 3;
  cfg.hysteresis = 1;
  cfg.min_scale = 2;
  LossScaler s(cfg);
  s.update(true);
  CHECK(s.scale() == 4);
  s.update(true);
  CHECK(s.scale() == 2);
  CHECK_THROWS_WITH_AS(s.update(true), doctest::Contains("overflowed at the minimum loss scale 2"), Error);
  cfg.error_at_min_scale = false;
  LossScaler quiet(cfg);
  for (int i = 0; i < 5; ++i) quiet.update(true);
  CHECK(quiet.scale() == 2);
}

TEST_CASE("a long script matches DeepSpeed's counters exactly") {
  LossScalerConfig cfg;
  cfg.window = 2;
  cfg.hysteresis = 2;
  // iter: 0  1  2  3  4  5  6  7  8  9
  // flag: 0  0  0  1  1  0  0  0  1  0
  // stable intervals (iter - last_overflow - 1) > 0 and even double: iter 2
  // (stable 2 from -1) doubles; iters 3, 4 overflow (tolerate, then halve);
  // iter 7 (stable 2 from 4) doubles; iter 8 overflow tolerated (hysteresis
  // refilled by the doubling).
  const std::vector<double> got = run(cfg, {0, 0, 0, 1, 1, 0, 0, 0, 1, 0});
  const std::vector<double> want = {65536, 65536, 131072, 131072, 65536, 65536, 65536, 131072, 131072, 131072};
  CHECK(got == want);
}

TEST_CASE("static scales never move, state round-trips, bad settings are refused") {
  LossScalerConfig st;
  st.dynamic = false;
  st.static_scale = 128;
  CHECK(run(st, {1, 1, 0}) == std::vector<double>{128, 128, 128});

  LossScaler a;
  a.update(true);
  a.update(false);
  LossScaler b;
  b.load_state(a.state());
  a.update(true);
  b.update(true);
  CHECK(a.scale() == b.scale());
  CHECK(a.state().iteration == b.state().iteration);

  LossScalerConfig bad;
  bad.hysteresis = 0;
  CHECK_THROWS_WITH_AS(LossScaler{bad}, doctest::Contains("fp16.hysteresis must be at least 1"), Error);
  LossScalerState broken;
  broken.scale = -1;
  CHECK_THROWS_WITH_AS(b.load_state(broken), doctest::Contains("not a positive number"), Error);
}
