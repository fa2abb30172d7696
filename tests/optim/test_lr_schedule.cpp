// Learning rates at chosen steps, worked out by hand from DeepSpeed's formulas.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>

#include "zest/core/check.h"
#include "zest/optim/lr_schedule.h"

using namespace zest;

TEST_CASE("WarmupLR: log and linear warmup, then flat, the first step is the minimum") {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupLR;
  c.warmup_min_lr = 0.0;
  c.warmup_max_lr = 0.01;
  c.warmup_num_steps = 10;
  CHECK(lr_for_step(c, 1.0, 0) == 0.0);  // iteration -1
  CHECK(lr_for_step(c, 1.0, 1) == 0.0);  // iteration 0: log(1) = 0
  CHECK(lr_for_step(c, 1.0, 4) == doctest::Approx(0.01 * std::log(4.0) / std::log(10.0)));
  CHECK(lr_for_step(c, 1.0, 11) == 0.01);  // iteration 10: warmup done
  CHECK(lr_for_step(c, 1.0, 500) == 0.01);
  c.warmup_type = WarmupType::kLinear;
  CHECK(lr_for_step(c, 1.0, 6) == doctest::Approx(0.005));  // iteration 5 of 10
}

TEST_CASE("WarmupDecayLR decays linearly to zero at total_num_steps") {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupDecayLR;
  c.warmup_max_lr = 0.02;
  c.warmup_num_steps = 4;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 14;
  CHECK(lr_for_step(c, 1.0, 3) == doctest::Approx(0.01));  // iteration 2 of 4
  CHECK(lr_for_step(c, 1.0, 5) == doctest::Approx(0.02));  // iteration 4: (14-4)/(14-4)
  CHECK(lr_for_step(c, 1.0, 10) == doctest::Approx(0.02 * 5.0 / 10.0));  // iteration 9
  CHECK(lr_for_step(c, 1.0, 15) == 0.0);  // iteration 14
  CHECK(lr_for_step(c, 1.0, 40) == 0.0);  // never negative
}

TEST_CASE("WarmupCosineLR scales the optimizer's lr by a ratio") {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupCosineLR;
  c.warmup_num_steps = 2;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 12;
  c.warmup_min_ratio = 0.1;
  c.cos_min_ratio = 0.0;
  CHECK(lr_for_step(c, 0.5, 0) == 0.0);
  CHECK(lr_for_step(c, 0.5, 1) == doctest::Approx(0.5 * 0.1));         // iteration 0
  CHECK(lr_for_step(c, 0.5, 2) == doctest::Approx(0.5 * (0.1 + 0.45)));  // iteration 1
  // iteration 6: 5 of 10 cosine steps done: ratio (1 + cos(pi/2)) / 2 = 0.5
  CHECK(lr_for_step(c, 0.5, 7) == doctest::Approx(0.25));
  CHECK(lr_for_step(c, 0.5, 12) == doctest::Approx(0.0).epsilon(1e-12));  // iteration 11
}

TEST_CASE("WarmupCosineLR holds at its floor past total_num_steps, as DeepSpeed clamps the progress") {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupCosineLR;
  c.warmup_num_steps = 2;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 12;
  c.cos_min_ratio = 0.25;
  // Iteration 11 completes the 10 cosine steps: ratio cos_min_ratio exactly
  // (cos(pi) = -1); without the clamp iteration 21 would be back at 1.
  const double floor = 0.5 * (0.25 + 0.75 * ((1.0 + std::cos(std::numbers::pi * 1.0)) / 2.0));
  CHECK(lr_for_step(c, 0.5, 12) == floor);
  CHECK(lr_for_step(c, 0.5, 17) == floor);
  CHECK(lr_for_step(c, 0.5, 22) == floor);
  CHECK(lr_for_step(c, 0.5, 1000) == floor);
}

TEST_CASE("a total_num_steps within the warmup runs (DeepSpeed warns), and 0 is refused") {
  LrScheduleConfig c;
  c.kind = LrScheduleKind::kWarmupDecayLR;
  c.warmup_num_steps = 100;
  c.warmup_max_lr = 0.02;
  c.warmup_type = WarmupType::kLinear;
  c.total_num_steps = 50;
  CHECK_NOTHROW(c.validate());
  // Still warming up at iteration 49; at iteration 100 the decay gamma is
  // max(0, (50 - 100) / max(1, 50 - 100)) = 0, as in DeepSpeed.
  CHECK(lr_for_step(c, 1.0, 50) == 0.02 * (49.0 / 100.0));
  CHECK(lr_for_step(c, 1.0, 101) == 0.0);
  c.kind = LrScheduleKind::kWarmupCosineLR;
  c.cos_min_ratio = 0.5;
  CHECK(lr_for_step(c, 1.0, 101) == 0.5);  // progress clamped to 1 at once
  c.total_num_steps = 0;
  CHECK_THROWS_WITH_AS(c.validate(), doctest::Contains("total_num_steps must be at least 1, got 0"), Error);
  c.kind = LrScheduleKind::kConstant;
  CHECK(lr_for_step(c, 0.3, 7) == 0.3);
  CHECK_THROWS_AS(lr_for_step(c, 0.3, -1), Error);
}
