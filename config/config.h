// The engine's configuration, with DeepSpeed's key names and defaults, so
// that a DeepSpeed JSON file that uses only what ZEST supports runs unchanged.
//
//   EngineConfig cfg = load_config_file("ds_config.json");
//   EngineConfig cfg = parse_config_json(R"({"zero_optimization": {"stage": 2}})");
//
// A key ZEST does not know, a value of the wrong type, or one out of range is
// a zest::Error naming the key (as a path, "zero_optimization.stage") and the
// values allowed.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "zest/core/dtype.h"
#include "zest/optim/loss_scaler.h"
#include "zest/optim/lr_schedule.h"
#include "zest/optim/optimizer.h"

namespace zest {

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  // Elements; unset: reduce_bucket()'s rule, which overlaps at every size.
  std::optional<int64_t> reduce_bucket_size;
  int64_t allgather_bucket_size = 500'000'000;  // elements
  std::optional<bool> overlap_comm;             // unset: on for stage 3, as in DeepSpeed
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;

  // DeepSpeed's overlap_comm: gradient reductions on the engine's
  // communication stream, so they run while backward goes on (true), or on
  // the compute stream, in line with backward (false). The bits are the same
  // either way.
  bool overlap() const { return overlap_comm.value_or(stage == 3); }

  // Note [the reduce bucket rule]. The elements of done gradients collected
  // before a reduction is launched, for a model of `padded_numel` flat
  // elements. reduce_bucket_size when set; otherwise a quarter of the model,
  // at most DeepSpeed's 5e8: a bucket as large as the model (DeepSpeed's
  // default for any model under 5e8 elements) reduces nothing until the
  // last unit's done() and so overlaps nothing, while a quarter launches
  // about four reductions, the first three behind the rest of backward, at
  // any size. At stage 3 it is also at most stage3_prefetch_bucket_size
  // (when that is positive), so a prefetch queued on the communication stream
  // waits behind at most one prefetch window of reductions, not a whole
  // bucket.
  int64_t reduce_bucket(size_t padded_numel) const;

};

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;

  LossScalerConfig scaler() const;
};

struct EngineConfig {
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  int64_t gradient_accumulation_steps = 1;
  double gradient_clipping = 0.0;  // 0: off
  ZeroConfig zero;
  Fp16Config fp16;
  bool bf16 = false;
  OptimizerConfig optimizer;
  LrScheduleConfig scheduler;
  // DeepSpeed's data_types.grad_accum_dtype: the dtype gradients are
  // accumulated in across micro-steps (fp32, fp16 or bf16). Unset:
  // DeepSpeed's default, which is fp32 for bf16 without ZeRO (stage 0) and
  // the compute dtype otherwise.
  std::optional<DType> grad_accum_dtype;

  // fp16, bf16 or fp32: what parameters and gradients are stored in. Throws
  // when fp16 and bf16 are both enabled.
  DType compute_dtype() const;

  // Fills in whichever of train_batch_size, train_micro_batch_size_per_gpu
  // and gradient_accumulation_steps is missing, as DeepSpeed does, and checks
  // that train_batch_size = micro x accumulation x world_size.
  void resolve_batch(int world_size);
};

EngineConfig parse_config_json(std::string_view json_text);
EngineConfig load_config_file(const std::string& path);

}  // namespace zest
