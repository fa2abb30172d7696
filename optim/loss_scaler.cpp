#include "zest/optim/loss_scaler.h"

#include <algorithm>
#include <cmath>

#include "zest/core/check.h"

namespace zest {

LossScaler::LossScaler(LossScalerConfig config) : config_(config) {
  if (config_.dynamic) {
    ZEST_CHECK(config_.initial_scale_power >= 0 && config_.initial_scale_power <= 64,
               "fp16.initial_scale_power must be in 0..64, got {}", config_.initial_scale_power);
    ZEST_CHECK(config_.window >= 1, "fp16.loss_scale_window must be at least 1, got {}", config_.window);
    ZEST_CHECK(config_.hysteresis >= 1, "fp16.hysteresis must be at least 1, got {}", config_.hysteresis);
    ZEST_CHECK(std::isfinite(config_.min_scale) && config_.min_scale > 0,
               "fp16.min_loss_scale must be a positive number, got {}", config_.min_scale);
    state_.scale = std::ldexp(1.0, config_.initial_scale_power);
  } else {
    ZEST_CHECK(std::isfinite(config_.static_scale) && config_.static_scale > 0,
               "fp16.loss_scale must be a positive number (or 0 for dynamic scaling), got {}",
               config_.static_scale);
    // Note [static loss scale bound].
    ZEST_CHECK(config_.static_scale <= kMaxStaticLossScale,
               "fp16.loss_scale is {:g}: a static loss scale above {:.4g} (65504 / 2^-24) overflows every gradient "
               "fp16 can hold, so every step would be skipped; use 0 (dynamic) or a scale such as 2^16",
               config_.static_scale, kMaxStaticLossScale);
    state_.scale = config_.static_scale;
  }
  state_.hysteresis_left = config_.hysteresis;
}

void LossScaler::update(bool overflow) {
  if (!config_.dynamic) {
    ++state_.iteration;
    return;
  }
  if (overflow) {
    if (config_.hysteresis == 1 || state_.hysteresis_left == 1) {
      ZEST_CHECK(!(state_.scale == config_.min_scale && config_.error_at_min_scale),
                 "fp16 gradients overflowed at the minimum loss scale {} (step {}): every step is "
                 "being skipped. Look for the cause of the Inf/NaN (learning rate, data, a layer "
                 "without normalization), train in bf16, or lower fp16.min_loss_scale",
                 config_.min_scale, state_.iteration);
      state_.scale = std::max(state_.scale / 2.0, config_.min_scale);
    } else {
      --state_.hysteresis_left;
    }
    state_.last_overflow_iteration = state_.iteration;
  } else {
    if (config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
    const int64_t stable = state_.iteration - state_.last_overflow_iteration - 1;
    if (stable > 0 && stable % config_.window == 0) {
      if (!config_.consecutive_hysteresis) state_.hysteresis_left = config_.hysteresis;
      state_.scale *= 2.0;
    }
  }
  ++state_.iteration;
}

void LossScaler::load_state(const LossScalerState& state) {
  ZEST_CHECK(std::isfinite(state.scale) && state.scale > 0,
             "loss scaler state has scale {}, which is not a positive number", state.scale);
  ZEST_CHECK(state.iteration >= 0 && state.last_overflow_iteration >= -1 &&
                 state.last_overflow_iteration < state.iteration + 1,
             "loss scaler state is inconsistent (iteration {}, last overflow {})", state.iteration,
             state.last_overflow_iteration);
  ZEST_CHECK(state.hysteresis_left >= 0 && state.hysteresis_left <= config_.hysteresis,
             "loss scaler state has {} hysteresis left, outside 0..{}", state.hysteresis_left,
             config_.hysteresis);
  state_ = state;
}

}  // namespace zest
