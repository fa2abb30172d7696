// Reading DeepSpeed-style JSON into EngineConfig. Every section is read
// through a Section, which remembers the keys it was asked for, so that any
// other key in the file is reported (with the keys that are allowed there)
// instead of being silently ignored.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <set>
#include <vector>

#include "zest/core/check.h"
#include "zest/config/config.h"
#include "zest/core/file_io.h"

namespace zest {
namespace {

using nlohmann::json;

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

class Section {
 public:
  Section(const json& j, std::string path) : j_(j), path_(std::move(path)) {
    ZEST_CHECK(j.is_object(), "config: {} must be an object ({{...}}), got {}", name(), j.type_name());
  }

  bool has(const char* key) {
    known_.emplace_back(key);
    return j_.contains(key) && !j_.at(key).is_null();
  }

  void read_bool(const char* key, bool& out) {
    if (!has(key)) return;
    const json& v = j_.at(key);
    ZEST_CHECK(v.is_boolean(), "config: {} must be true or false, got {}", where(key), v.dump());
    out = v.get<bool>();
  }

  void read_bool(const char* key, std::optional<bool>& out) {
    bool b = false;
    if (!has(key)) return;
    read_bool(key, b);
    out = b;
  }

  // Whole numbers; DeepSpeed files often write sizes as 5e8, which JSON
  // reads as a float: accepted when it is integral.
  void read_int(const char* key, int64_t& out, int64_t lo, int64_t hi) {
    if (!has(key)) return;
    const json& v = j_.at(key);
    refuse_auto(key, v);
    int64_t x = 0;
    if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::nearbyint(v.get<double>()) == v.get<double>() &&
               std::fabs(v.get<double>()) < 9.0e18) {
      x = static_cast<int64_t>(v.get<double>());
    } else {
      ZEST_FAIL("config: {} must be a whole number, got {}", where(key), v.dump());
    }
    ZEST_CHECK(x >= lo && x <= hi, "config: {} is {}; allowed: {} to {}", where(key), x, lo, hi);
    out = x;
  }

  void read_int(const char* key, int& out, int lo, int hi) {
    int64_t x = out;
    read_int(key, x, lo, hi);
    out = static_cast<int>(x);
  }

  void read_int(const char* key, std::optional<int64_t>& out, int64_t lo, int64_t hi) {
    int64_t x = 0;
    if (!has(key)) return;
    read_int(key, x, lo, hi);
    out = x;
  }

  void read_double(const char* key, double& out, double lo, double hi) {
    if (!has(key)) return;
    const json& v = j_.at(key);
    refuse_auto(key, v);
    ZEST_CHECK(v.is_number(), "config: {} must be a number, got {}", where(key), v.dump());
    const double x = v.get<double>();
    ZEST_CHECK(std::isfinite(x) && x >= lo && x <= hi, "config: {} is {}; allowed: {} to {}",
               where(key), x, lo, hi);
    out = x;
  }

  void read_float(const char* key, float& out, double lo, double hi) {
    double x = out;
    read_double(key, x, lo, hi);
    out = static_cast<float>(x);
  }

  // One of `allowed`, compared without case (DeepSpeed accepts "adamw" and
  // "AdamW" alike). Returns the index into `allowed`, or -1 when absent.
  int read_choice(const char* key, const std::vector<std::string>& allowed) {
    if (!has(key)) return -1;
    const json& v = j_.at(key);
    ZEST_CHECK(v.is_string(), "config: {} must be a string, one of {}; got {}", where(key),
               join(allowed), v.dump());
    const std::string s = lower(v.get<std::string>());
    for (size_t i = 0; i < allowed.size(); ++i) {
      if (lower(allowed[i]) == s) return static_cast<int>(i);
    }
    ZEST_FAIL("config: {} is \"{}\"; allowed: {}", where(key), v.get<std::string>(), join(allowed));
  }

  std::optional<Section> sub(const char* key) {
    if (!has(key)) return std::nullopt;
    return Section(j_.at(key), where(key));
  }

  const json& raw(const char* key) {
    known_.emplace_back(key);
    return j_.at(key);
  }

  std::string where(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

  // Every key of the section must have been asked for.
  void finish() const {
    for (const auto& [key, value] : j_.items()) {
      if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
      std::vector<std::string> sorted = known_;
      std::sort(sorted.begin(), sorted.end());
      ZEST_FAIL("config: unknown key '{}' in {}; ZEST accepts: {}", where(key.c_str()), name(),
                join(sorted));
    }
  }

 private:
  static std::string lower(std::string s) {
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s;
  }
  void refuse_auto(const char* key, const json& v) const {
    ZEST_CHECK(!(v.is_string() && v.get<std::string>() == "auto"),
               "config: {} is \"auto\", a placeholder that another framework fills in; write "
               "the value", where(key));
  }
  std::string name() const { return path_.empty() ? "the top level" : path_; }

  const json& j_;
  std::string path_;
  std::vector<std::string> known_;
};

constexpr int64_t kMaxCount = int64_t{1} << 50;

void read_zero(Section& s, ZeroConfig& z) {
  int64_t stage = z.stage;
  s.read_int("stage", stage, 0, 3);
  z.stage = static_cast<int>(stage);
  s.read_bool("contiguous_gradients", z.contiguous_gradients);
  // DeepSpeed's switches for behaviour ZEST always has: only their default is accepted.
  for (const char* always_on : {"reduce_scatter", "allgather_partitions"}) {
    bool v = true;
    s.read_bool(always_on, v);
    ZEST_CHECK(v, "config: {} false is not supported; ZEST always uses it (remove the key or set "
                  "it to true)", s.where(always_on));
  }
  s.read_int("reduce_bucket_size", z.reduce_bucket_size, 1, kMaxCount);  // unset: ZeroConfig::reduce_bucket
  s.read_int("allgather_bucket_size", z.allgather_bucket_size, 1, kMaxCount);
  s.read_bool("overlap_comm", z.overlap_comm);
  s.read_int("stage3_prefetch_bucket_size", z.stage3_prefetch_bucket_size, 0, kMaxCount);
  s.read_int("stage3_param_persistence_threshold", z.stage3_param_persistence_threshold, 0, kMaxCount);
  s.read_int("stage3_max_live_parameters", z.stage3_max_live_parameters, 0, kMaxCount);
  s.finish();
}

void read_fp16(Section& s, Fp16Config& f) {
  s.read_bool("enabled", f.enabled);
  s.read_double("loss_scale", f.loss_scale, 0.0, 1e38);
  s.read_int("initial_scale_power", f.initial_scale_power, 0, 64);
  s.read_int("loss_scale_window", f.loss_scale_window, 1, kMaxCount);
  s.read_int("hysteresis", f.hysteresis, 1, 1 << 20);
  s.read_bool("consecutive_hysteresis", f.consecutive_hysteresis);
  s.read_double("min_loss_scale", f.min_loss_scale, 1e-38, 1e38);
  s.finish();
}

void read_optimizer(Section& s, OptimizerConfig& o) {
  const int type = s.read_choice("type", {"AdamW", "Adam", "SGD"});
  ZEST_CHECK(type >= 0, "config: optimizer.type is required; allowed: AdamW, Adam, SGD");
  o.kind = type == 0 ? OptimizerKind::kAdamW : type == 1 ? OptimizerKind::kAdam : OptimizerKind::kSgd;
  // DeepSpeed's defaults: its Adam and AdamW are FusedAdam, whose
  // weight_decay defaults to 0 (unlike torch.optim.AdamW's 0.01).
  o.weight_decay = 0.0f;
  std::optional<Section> p = s.sub("params");
  s.finish();
  // DeepSpeed's "Adam" is FusedAdam with adam_w_mode on by default, which is
  // AdamW; adam_w_mode false gives Adam with L2 weight decay.
  bool adam_w_mode = true;
  if (p && o.kind == OptimizerKind::kAdam) p->read_bool("adam_w_mode", adam_w_mode);
  if (o.kind == OptimizerKind::kAdam && adam_w_mode) o.kind = OptimizerKind::kAdamW;
  if (!p) return;
  p->read_float("lr", o.lr, 0.0, 1e6);
  p->read_float("weight_decay", o.weight_decay, 0.0, 1e6);
  p->read_int("host_threads", o.host_threads, 1, 1024);  // ZEST's own: OptimizerConfig::host_threads
  if (o.kind == OptimizerKind::kSgd) {
    p->read_float("momentum", o.momentum, 0.0, 0.999999);
    p->read_float("dampening", o.dampening, 0.0, 1.0);
    p->read_bool("nesterov", o.nesterov);
  } else {
    if (p->has("betas")) {
      const json& b = p->raw("betas");
      ZEST_CHECK(b.is_array() && b.size() == 2 && b[0].is_number() && b[1].is_number(),
                 "config: optimizer.params.betas must be a list of two numbers, got {}", b.dump());
      o.beta1 = b[0].get<float>();
      o.beta2 = b[1].get<float>();
    }
    p->read_float("eps", o.eps, 1e-38, 1.0);
    p->read_bool("bias_correction", o.bias_correction);
  }
  p->finish();
  o.validate();
}

void read_scheduler(Section& s, LrScheduleConfig& c) {
  const int type = s.read_choice("type", {"WarmupLR", "WarmupDecayLR", "WarmupCosineLR"});
  ZEST_CHECK(type >= 0, "config: scheduler.type is required; allowed: WarmupLR, WarmupDecayLR, WarmupCosineLR");
  c.kind = type == 0 ? LrScheduleKind::kWarmupLR
           : type == 1 ? LrScheduleKind::kWarmupDecayLR
                       : LrScheduleKind::kWarmupCosineLR;
  std::optional<Section> p = s.sub("params");
  s.finish();
  if (p) {
    if (c.kind == LrScheduleKind::kWarmupCosineLR) {
      p->read_double("warmup_min_ratio", c.warmup_min_ratio, 0.0, 1.0);
      p->read_double("cos_min_ratio", c.cos_min_ratio, 0.0, 1.0);
    } else {
      p->read_double("warmup_min_lr", c.warmup_min_lr, 0.0, 1e6);
      p->read_double("warmup_max_lr", c.warmup_max_lr, 0.0, 1e6);
    }
    p->read_int("warmup_num_steps", c.warmup_num_steps, 0, kMaxCount);
    if (c.kind != LrScheduleKind::kWarmupLR) p->read_int("total_num_steps", c.total_num_steps, 1, kMaxCount);
    const int warmup = p->read_choice("warmup_type", {"log", "linear"});
    if (warmup >= 0) c.warmup_type = warmup == 0 ? WarmupType::kLog : WarmupType::kLinear;
    p->finish();
  }
  c.validate();
}

}  // namespace

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

void EngineConfig::resolve_batch(int world_size) {
  ZEST_CHECK(world_size >= 1, "resolve_batch: world_size must be at least 1, got {}", world_size);
  const int64_t w = world_size;
  const bool has_total = train_batch_size.has_value();
  const bool has_micro = train_micro_batch_size_per_gpu.has_value();
  if (has_total && !has_micro) {
    ZEST_CHECK(*train_batch_size % (gradient_accumulation_steps * w) == 0,
               "config: train_batch_size {} is not divisible by gradient_accumulation_steps {} x "
               "{} ranks", *train_batch_size, gradient_accumulation_steps, w);
    train_micro_batch_size_per_gpu = *train_batch_size / (gradient_accumulation_steps * w);
  } else if (!has_total && has_micro) {
    train_batch_size = *train_micro_batch_size_per_gpu * gradient_accumulation_steps * w;
  } else if (!has_total && !has_micro) {
    ZEST_FAIL("config: set train_batch_size or train_micro_batch_size_per_gpu (or both)");
  }
  ZEST_CHECK(*train_batch_size == *train_micro_batch_size_per_gpu * gradient_accumulation_steps * w,
             "config: train_batch_size {} != train_micro_batch_size_per_gpu {} x "
             "gradient_accumulation_steps {} x {} ranks", *train_batch_size,
             *train_micro_batch_size_per_gpu, gradient_accumulation_steps, w);
}

EngineConfig parse_config_json(std::string_view json_text) {
  json j;
  try {
    j = json::parse(json_text.begin(), json_text.end());
  } catch (const json::parse_error& e) {
    ZEST_FAIL("config: not valid JSON: {}", e.what());
  }
  EngineConfig cfg;
  Section top(j, "");
  top.read_int("train_batch_size", cfg.train_batch_size, 1, kMaxCount);
  top.read_int("train_micro_batch_size_per_gpu", cfg.train_micro_batch_size_per_gpu, 1, kMaxCount);
  top.read_int("gradient_accumulation_steps", cfg.gradient_accumulation_steps, 1, 1 << 30);
  top.read_double("gradient_clipping", cfg.gradient_clipping, 0.0, 1e38);
  if (auto s = top.sub("zero_optimization")) read_zero(*s, cfg.zero);
  if (auto s = top.sub("fp16")) read_fp16(*s, cfg.fp16);
  if (auto s = top.sub("bf16")) {
    s->read_bool("enabled", cfg.bf16);
    s->finish();
  }
  if (auto s = top.sub("data_types")) {
    // DeepSpeed's DtypeEnum spellings of the three floating dtypes.
    const int t = s->read_choice("grad_accum_dtype", {"fp32", "float32", "torch.float32", "float", "fp16",
                                                      "float16", "torch.float16", "half", "bf16",
                                                      "bfloat16", "torch.bfloat16"});
    if (t >= 0) cfg.grad_accum_dtype = t < 4 ? DType::kFloat32 : t < 8 ? DType::kFloat16 : DType::kBFloat16;
    s->finish();
  }
  if (auto s = top.sub("optimizer")) read_optimizer(*s, cfg.optimizer);
  if (auto s = top.sub("scheduler")) read_scheduler(*s, cfg.scheduler);
  top.finish();
  ZEST_CHECK(!(cfg.fp16.enabled && cfg.bf16),
             "config: fp16.enabled and bf16.enabled are both true; choose one");
  return cfg;
}

EngineConfig load_config_file(const std::string& path) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    ZEST_FAIL("config: {}", e.message());
  }
  try {
    return parse_config_json(text);
  } catch (const Error& e) {
    ZEST_FAIL("{} (in {})", e.message(), path);
  }
}

}  // namespace zest
