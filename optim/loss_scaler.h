// Loss scaling for fp16 training, with DeepSpeed's rules and defaults so that a
// DeepSpeed config behaves the same here.
//
// The loss is multiplied by scale() before backward, so small gradients do not
// underflow in fp16; the step divides it back out. Dynamic scaling starts at
// 2^initial_scale_power. On an overflow (an Inf or NaN anywhere in the
// gradients, agreed across ranks) the step is skipped and, once `hysteresis`
// overflows have used up the tolerance, the scale halves (never below
// min_scale). After `window` steps in a row without overflow it doubles and
// the tolerance is restored. A static scale (loss_scale > 0) never changes,
// and overflows under it still skip the step.
#pragma once

#include <cstdint>
#include <string>

namespace zest {

// The bound on a static fp16 loss scale. Note [static loss scale bound]:
// fp16 holds magnitudes up to 65504, and its smallest step is 2^-24. Scaled
// by more than 65504 / 2^-24 (about 1.1e12), every gradient element that
// fp16 could represent unscaled overflows, so every step with any such
// element is skipped, forever (a static scale never backs off). DeepSpeed's
// dynamic scaler starts at 2^16 and the largest initial scales in use are
// about 2^32, far below.
inline constexpr double kMaxStaticLossScale = 65504.0 * 16777216.0;

struct LossScalerConfig {
  bool dynamic = true;
  double static_scale = 1.0;       // used when !dynamic
  int initial_scale_power = 16;    // DeepSpeed fp16.initial_scale_power
  int64_t window = 1000;           // fp16.loss_scale_window
  int hysteresis = 2;              // fp16.hysteresis
  bool consecutive_hysteresis = false;
  double min_scale = 1.0;          // fp16.min_loss_scale
  // DeepSpeed stops the run when an overflow happens at the minimum scale:
  // training would otherwise skip every step from then on without saying so.
  bool error_at_min_scale = true;
};

// The state that must be saved with a checkpoint to resume exactly.
struct LossScalerState {
  double scale = 1.0;
  int64_t iteration = 0;
  int64_t last_overflow_iteration = -1;
  int hysteresis_left = 0;
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig config = {});

  double scale() const { return state_.scale; }
  const LossScalerConfig& config() const { return config_; }

  // Records the outcome of one step: true when the gradients overflowed (the
  // step is then skipped by the caller). Throws zest::Error when an overflow
  // happens at the minimum scale and error_at_min_scale is set.
  void update(bool overflow);

  const LossScalerState& state() const { return state_; }
  void load_state(const LossScalerState& state);

 private:
  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace zest
