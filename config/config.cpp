// EngineConfig's own rules: DeepSpeed's batch arithmetic, the compute dtype,
// the loss scaler's settings and the reduce bucket.
#include "zest/config/config.h"

#include <fmt/format.h>

#include <algorithm>

#include "zest/core/check.h"

namespace zest {
namespace {

// micro x accumulation x world, or an Error when it does not fit in 64 bits.
int64_t batch_product(int64_t micro, int64_t accum, int64_t world) {
  int64_t a = 0, b = 0;
  ZEST_CHECK(!__builtin_mul_overflow(micro, accum, &a) && !__builtin_mul_overflow(a, world, &b),
             "config: train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x {} ranks does not fit in "
             "64 bits",
             micro, accum, world);
  return b;
}

}  // namespace

void ZeroConfig::check_mics(int world, bool offloads_optimizer) const {
  const int s = mics_shard_size;
  if (s <= 0 || stage != 3) return;
  ZEST_CHECK(s <= world && world % s == 0,
             "zero.mics_shard_size is {} but the data-parallel world has {} ranks: the shard groups must divide "
             "the world evenly (DeepSpeed asserts the same); set mics_shard_size to a divisor of {}",
             s, world, world);
  ZEST_CHECK(!offloads_optimizer || s == world,
             "zero.mics_shard_size {} with offload_optimizer (device cpu): DeepSpeed's MiCS refuses CPU offload "
             "(\"Local sharding has no support for CPU offloading\"), and so does ZEST; set "
             "offload_optimizer.device to \"none\", or mics_shard_size to -1",
             s);
}

void ZeroConfig::check_hpz(int world, bool offloads_params) const {
  const int h = zero_hpz_partition_size;
  if (h <= 1 || stage != 3) return;
  ZEST_CHECK(h >= world || world % h == 0,
             "zero.zero_hpz_partition_size is {} but the data-parallel world has {} ranks: the hpZ groups must "
             "divide the world evenly (DeepSpeed asserts the same); set it to a divisor of {}, or 1 for off",
             h, world, world);
  ZEST_CHECK(mics_shard_size <= 0,
             "zero.zero_hpz_partition_size {} with mics_shard_size {}: hpZ's secondary copy is for flat stage 3, "
             "and ZEST does not combine the two; use one of them",
             h, mics_shard_size);
  ZEST_CHECK(!offloads_params,
             "zero.zero_hpz_partition_size {} with offload_param (device cpu or nvme) is not supported: ZEST keeps "
             "hpZ's secondary copy on the device; set offload_param.device to \"none\", or zero_hpz_partition_size "
             "to 1",
             h);
}

int64_t ZeroConfig::reduce_bucket(size_t padded_numel) const {
  constexpr int64_t kDeepSpeedDefault = 500'000'000;
  int64_t bucket = reduce_bucket_size.value_or(
      std::clamp<int64_t>(static_cast<int64_t>((padded_numel + 3) / 4), 1, kDeepSpeedDefault));
  if (stage == 3 && stage3_prefetch_bucket_size > 0) bucket = std::min(bucket, stage3_prefetch_bucket_size);
  return bucket;
}

LossScalerConfig Fp16Config::scaler() const {
  LossScalerConfig s;
  s.dynamic = loss_scale == 0.0;
  s.static_scale = s.dynamic ? 1.0 : loss_scale;
  s.initial_scale_power = initial_scale_power;
  s.window = loss_scale_window;
  s.hysteresis = hysteresis;
  s.consecutive_hysteresis = consecutive_hysteresis;
  s.min_scale = min_loss_scale;
  return s;
}

DType EngineConfig::compute_dtype() const {
  ZEST_CHECK(!(fp16.enabled && bf16), "fp16.enabled and bf16.enabled are both true: choose one compute dtype");
  if (fp16.enabled) return DType::kFloat16;
  if (bf16) return DType::kBFloat16;
  return DType::kFloat32;
}

// Note [DeepSpeed's batch rules]. DeepSpeedConfig._set_batch_related_parameters
// fills the missing member of the triple with integer (floor) divisions, and
// _batch_assertion then checks each is positive and that
// train_batch_size == micro x accumulation x world. So 30/8/- on 1 rank
// derives accumulation 30 // 8 = 3 and then fails 30 != 8 x 3 x 1, rather
// than rounding silently; ZEST follows it exactly, and says which member was
// derived so the arithmetic in the error can be followed.
void EngineConfig::resolve_batch(int world_size) {
  ZEST_CHECK(world_size >= 1, "resolve_batch: world_size must be at least 1, got {}", world_size);
  const int64_t w = world_size;
  std::optional<int64_t>& batch = train_batch_size;
  std::optional<int64_t>& micro = train_micro_batch_size_per_gpu;
  std::optional<int64_t>& accum = gradient_accumulation_steps;
  for (const auto& [name, v] : {std::pair{"train_batch_size", batch}, std::pair{"train_micro_batch_size_per_gpu", micro},
                                std::pair{"gradient_accumulation_steps", accum}}) {
    ZEST_CHECK(!v || *v >= 1, "config: {} is {}; it must be at least 1", name, *v);
  }
  std::string derived;
  if (batch && micro && accum) {
    // all three given: checked below
  } else if (batch && micro) {
    accum = *batch / *micro / w;
    derived = fmt::format("gradient_accumulation_steps derived as {} // {} // {} = {}", *batch, *micro, w, *accum);
  } else if (batch && accum) {
    micro = *batch / w / *accum;
    derived = fmt::format("train_micro_batch_size_per_gpu derived as {} // {} // {} = {}", *batch, w, *accum, *micro);
  } else if (micro && accum) {
    batch = batch_product(*micro, *accum, w);
    return;
  } else if (batch) {
    accum = 1;
    micro = *batch / w;
    derived = fmt::format("train_micro_batch_size_per_gpu derived as {} // {} = {}, gradient_accumulation_steps 1",
                          *batch, w, *micro);
  } else if (micro) {
    accum = 1;
    batch = batch_product(*micro, 1, w);
    return;
  } else {
    accum = accum.value_or(1);
    return;
  }
  const std::string how = derived.empty() ? "" : " (" + derived + ")";
  ZEST_CHECK(*micro >= 1 && *accum >= 1,
             "config: train_batch_size {} cannot be split over {} rank{}{}: make it a multiple of "
             "train_micro_batch_size_per_gpu x gradient_accumulation_steps x ranks",
             *batch, w, w == 1 ? "" : "s", how);
  const int64_t product = batch_product(*micro, *accum, w);
  ZEST_CHECK(*batch == product,
             "config: train_batch_size {} != train_micro_batch_size_per_gpu {} x gradient_accumulation_steps {} x {} "
             "rank{} = {}{}: make them agree (or leave one of the three out to have it derived)",
             *batch, *micro, *accum, w, w == 1 ? "" : "s", product, how);
}

std::string EngineConfig::batch_summary(int world_size) const {
  if (!train_batch_size || !train_micro_batch_size_per_gpu) return {};
  return fmt::format("train_batch_size {} = micro {} x accumulation {} x {} rank{}", *train_batch_size,
                     *train_micro_batch_size_per_gpu, accumulation_steps(), world_size, world_size == 1 ? "" : "s");
}

}  // namespace zest
