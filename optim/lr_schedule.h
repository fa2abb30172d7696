// Learning-rate schedules with DeepSpeed's names, parameters and curves
// (deepspeed.runtime.lr_schedules), so a DeepSpeed "scheduler" section gives
// the same learning rate at every step.
//
// DeepSpeed evaluates a schedule at "last_batch_iteration", which starts at -1
// and advances after every applied optimizer step: the first step runs at
// iteration -1 (the warmup's starting value; 0 for WarmupCosineLR), the second
// at iteration 0, and so on. lr_for_step() takes the number of steps already
// applied and does that bookkeeping.
#pragma once

#include <cstdint>
#include <string_view>

namespace zest {

enum class LrScheduleKind : uint8_t { kConstant, kWarmupLR, kWarmupDecayLR, kWarmupCosineLR };
enum class WarmupType : uint8_t { kLog, kLinear };

std::string_view lr_schedule_name(LrScheduleKind kind);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kConstant;
  // WarmupLR, WarmupDecayLR
  double warmup_min_lr = 0.0;
  double warmup_max_lr = 0.001;
  // all warmups (DeepSpeed uses at least 2)
  int64_t warmup_num_steps = 1000;
  WarmupType warmup_type = WarmupType::kLog;
  // WarmupDecayLR, WarmupCosineLR
  int64_t total_num_steps = 0;
  // WarmupCosineLR: ratios of the optimizer's lr
  double warmup_min_ratio = 0.0;
  double cos_min_ratio = 0.0001;

  void validate() const;
};

// The learning rate of the step after `applied_steps` applied steps.
// `base_lr` is the optimizer's lr (used by kConstant and WarmupCosineLR).
double lr_for_step(const LrScheduleConfig& config, double base_lr, int64_t applied_steps);

}  // namespace zest
