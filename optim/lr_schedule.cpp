#include "zest/optim/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "zest/core/check.h"

namespace zest {
namespace {

// DeepSpeed's warmup fraction at iteration `it` (< warmup steps).
double warmup_gamma(const LrScheduleConfig& c, int64_t warmup, int64_t it) {
  if (c.warmup_type == WarmupType::kLog) {
    return std::log(static_cast<double>(it + 1)) / std::log(static_cast<double>(warmup));
  }
  return static_cast<double>(it) / static_cast<double>(warmup);
}

}  // namespace

std::string_view lr_schedule_name(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant: return "constant";
    case LrScheduleKind::kWarmupLR: return "WarmupLR";
    case LrScheduleKind::kWarmupDecayLR: return "WarmupDecayLR";
    case LrScheduleKind::kWarmupCosineLR: return "WarmupCosineLR";
  }
  return "unknown";
}

void LrScheduleConfig::validate() const {
  const std::string_view name = lr_schedule_name(kind);
  if (kind == LrScheduleKind::kConstant) return;
  ZEST_CHECK(warmup_num_steps >= 0, "{}: warmup_num_steps must be >= 0, got {}", name, warmup_num_steps);
  ZEST_CHECK(std::isfinite(warmup_min_lr) && std::isfinite(warmup_max_lr) && warmup_min_lr >= 0 &&
                 warmup_max_lr >= 0,
             "{}: warmup_min_lr and warmup_max_lr must be finite and >= 0, got {} and {}", name,
             warmup_min_lr, warmup_max_lr);
  if (kind == LrScheduleKind::kWarmupDecayLR || kind == LrScheduleKind::kWarmupCosineLR) {
    // At or below the warmup DeepSpeed only warns (the decay never starts
    // before the end); the config reader notes it.
    ZEST_CHECK(total_num_steps >= 1, "{}: total_num_steps must be at least 1, got {}", name, total_num_steps);
  }
  if (kind == LrScheduleKind::kWarmupCosineLR) {
    ZEST_CHECK(warmup_min_ratio >= 0 && warmup_min_ratio <= 1 && cos_min_ratio >= 0 && cos_min_ratio <= 1,
               "WarmupCosineLR: warmup_min_ratio and cos_min_ratio must be in [0, 1], got {} and {}",
               warmup_min_ratio, cos_min_ratio);
  }
}

double lr_for_step(const LrScheduleConfig& c, double base_lr, int64_t applied_steps) {
  ZEST_CHECK(applied_steps >= 0, "lr_for_step: applied_steps must be >= 0, got {}", applied_steps);
  const int64_t it = applied_steps - 1;  // DeepSpeed's last_batch_iteration
  const int64_t warmup = std::max<int64_t>(2, c.warmup_num_steps);
  switch (c.kind) {
    case LrScheduleKind::kConstant:
      return base_lr;
    case LrScheduleKind::kWarmupLR:
    case LrScheduleKind::kWarmupDecayLR: {
      if (it < 0) return c.warmup_min_lr;
      double gamma = 1.0;
      if (it < warmup) {
        gamma = warmup_gamma(c, warmup, it);
      } else if (c.kind == LrScheduleKind::kWarmupDecayLR) {
        gamma = std::max(0.0, static_cast<double>(c.total_num_steps - it) /
                                  static_cast<double>(std::max<int64_t>(1, c.total_num_steps - warmup)));
      }
      return c.warmup_min_lr + (c.warmup_max_lr - c.warmup_min_lr) * gamma;
    }
    case LrScheduleKind::kWarmupCosineLR: {
      if (it < 0) return 0.0;
      double ratio;
      if (it < warmup) {
        ratio = c.warmup_min_ratio + warmup_gamma(c, warmup, it) * (1.0 - c.warmup_min_ratio);
      } else {
        // Past total_num_steps the progress holds at 1: the rate stays at
        // its floor (cos_min_ratio), as DeepSpeed's get_lr_ratio clamps it.
        const double done = static_cast<double>(it - warmup + 1);
        const double span = static_cast<double>(std::max<int64_t>(1, c.total_num_steps - warmup));
        const double progress = std::min(1.0, done / span);
        const double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
        ratio = std::max(0.0, c.cos_min_ratio + (1.0 - c.cos_min_ratio) * cosine);
      }
      return base_lr * ratio;
    }
  }
  ZEST_INTERNAL_ASSERT(false, "unknown schedule kind");
}

}  // namespace zest
