// Reading a DeepSpeed JSON file into EngineConfig: the top level, the batch
// triple, the precision sections, and the one error listing every problem.
// The other sections are read in config_zero.cpp, config_optimizer.cpp and
// config_features.cpp; config_reader.h says how a section is read.
#include <fmt/format.h>

#include "zest/config/detail/config_sections.h"
#include "zest/config/detail/json_parse.h"
#include "zest/core/check.h"
#include "zest/core/file_io.h"

namespace zest {
namespace config_detail {
namespace {

bool is_auto(const json* v) { return v && v->is_string() && v->get_ref<const std::string&>() == "auto"; }

// The batch triple, with Hugging Face's "auto": micro and accumulation from
// the program, the batch as world x micro x accumulation when the program
// gives its world size (otherwise the Engine derives it at the real one).
void read_batch(Section& top, FileState& file) {
  const AutoValues& p = file.program;
  EngineConfig& c = file.out;
  const bool any_auto = is_auto(top.get("train_batch_size")) || is_auto(top.get("train_micro_batch_size_per_gpu")) ||
                        is_auto(top.get("gradient_accumulation_steps"));
  const AutoRule<int64_t> micro{p.micro_batch_size, "micro_batch_size"};
  const AutoRule<int64_t> accum{p.gradient_accumulation_steps, "gradient_accumulation_steps"};
  top.read_int("train_micro_batch_size_per_gpu", c.train_micro_batch_size_per_gpu, 1, kMaxCount, &micro);
  top.read_int("gradient_accumulation_steps", c.gradient_accumulation_steps, 1, 1 << 30, &accum);
  AutoRule<int64_t> batch{std::nullopt, "world_size", "world_size x micro x accumulation"};
  if (p.world_size && (*p.world_size < 1 || *p.world_size > (1 << 20))) {
    file.problem(fmt::format("AutoValues::world_size is {}; allowed: 1 to 2^20", *p.world_size));
  } else if (p.world_size && c.train_micro_batch_size_per_gpu) {
    // At most 2^20 x 2^50 x 2^30 would overflow: a product past kMaxCount is
    // left to read_int's range check through a clamped value.
    const double product = double(*p.world_size) * double(*c.train_micro_batch_size_per_gpu) *
                           double(c.accumulation_steps());
    batch.program = product > double(kMaxCount) ? kMaxCount + 1 : static_cast<int64_t>(product);
    // Without a known accumulation a written batch size is what derives it.
    batch.must_match = c.gradient_accumulation_steps.has_value();
  }
  top.read_int("train_batch_size", c.train_batch_size, 1, kMaxCount, &batch);
  if (any_auto && !c.train_batch_size && !c.train_micro_batch_size_per_gpu) {
    file.problem("train_batch_size and train_micro_batch_size_per_gpu: \"auto\" left both unset, and DeepSpeed needs "
                 "one of them: set AutoValues::micro_batch_size (or write a value)");
  }
}

// fp16.enabled / bf16.enabled "auto": from the program's compute dtype.
AutoRule<bool> dtype_rule(const AutoValues& p, DType which) {
  AutoRule<bool> r{std::nullopt, "compute_dtype"};
  if (p.compute_dtype) r.program = *p.compute_dtype == which;
  return r;
}

// kMaxStaticLossScale: Note [static loss scale bound] in optim/loss_scaler.h.

void read_fp16(Section& top, FileState& file) {
  std::optional<Section> s = top.sub("fp16", Unknown::kIgnoreUnlessTypo);
  if (!s) return;
  s->coerce_like_pydantic();  // DeepSpeedFP16Config
  Fp16Config& f = file.out.fp16;
  const AutoRule<bool> enabled = dtype_rule(file.program, DType::kFloat16);
  s->read_bool("enabled", f.enabled, &enabled);
  if (const json* v = s->get("loss_scale"); v && v->is_number() && v->get<double>() > kMaxStaticLossScale) {
    s->problem("loss_scale", fmt::format("is {}: a static loss scale above {:.4g} (65504 / 2^-24) overflows every "
                                         "gradient fp16 can hold, so every step would be skipped; use 0 (dynamic) "
                                         "or a scale such as 2^16",
                                         v->get<double>(), kMaxStaticLossScale));
  } else {
    s->read_double("loss_scale", f.loss_scale, 0.0, kMaxStaticLossScale);
  }
  s->read_int("initial_scale_power", f.initial_scale_power, 0, 64);
  s->read_int("loss_scale_window", f.loss_scale_window, 1, kMaxCount);
  s->read_int("hysteresis", f.hysteresis, 1, 1 << 20);
  s->read_bool("consecutive_hysteresis", f.consecutive_hysteresis);
  s->read_double("min_loss_scale", f.min_loss_scale, 1e-38, kMaxStaticLossScale);
  s->ignore("auto_cast", "casts the inputs of DeepSpeed's forward to fp16; ZEST does not run the forward, so your "
                         "model casts its own inputs");
  s->refuse_if("fp16_master_weights_and_grads", is_on, "fp16 master weights and gradients (ZEST keeps fp32 master "
               "weights)", "false, as in ZEST");
  s->finish();
}

void read_bf16(Section& top, FileState& file) {
  const char* key = top.either("bf16", "bfloat16");  // "bfloat16": DeepSpeed's older name
  if (!key) return;
  std::optional<Section> s = top.sub(key, Unknown::kIgnoreUnlessTypo);
  if (!s) return;
  s->coerce_like_pydantic();  // DeepSpeedBF16Config
  const AutoRule<bool> enabled = dtype_rule(file.program, DType::kBFloat16);
  s->read_bool("enabled", file.out.bf16, &enabled);
  s->ignore("immediate_grad_update", "when DeepSpeed's bf16 optimizer copies gradients to fp32, a matter of speed; "
                                     "data_types.grad_accum_dtype sets the accumulation dtype");
  // true, DeepSpeed's default, is what ZEST does at every dtype: a step with
  // a non-finite gradient is skipped (StepResult::skip_reason).
  s->refuse_if("check_grad_overflow", [](const json& v) { return !(v.is_boolean() && v.get<bool>()); },
               "applying steps whose gradients are not finite (check_grad_overflow false; ZEST always skips them)",
               "true, as in ZEST");
  // Note [bf16 master weights and optimizer state] (optim/optimizer.h); the
  // Engine checks DeepSpeed's rules for them against the rest of the config.
  s->read_bool("bf16_master_weights_and_grads", file.out.bf16_master_weights_and_grads);
  s->read_bool("bf16_optimizer_states", file.out.bf16_optimizer_states);
  for (const char* k : {"loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
                        "consecutive_hysteresis", "min_loss_scale", "auto_cast"}) {
    s->ignore(k, "an fp16 setting: bf16 needs no loss scale, and DeepSpeed reads it only under fp16");
  }
  s->finish();
}

// DeepSpeed's DtypeEnum spellings of the floating dtypes: fp32 (0-3), fp16
// (4-7), bf16 (8-10).
const std::vector<std::string> kDTypeNames = {"fp32", "float32", "torch.float32", "float",
                                              "fp16", "float16", "torch.float16", "half",
                                              "bf16", "bfloat16", "torch.bfloat16"};
DType dtype_at(int i) { return i < 4 ? DType::kFloat32 : i < 8 ? DType::kFloat16 : DType::kBFloat16; }

}  // namespace

void read_precision(Section& top, FileState& file) {
  EngineConfig& c = file.out;
  read_fp16(top, file);
  read_bf16(top, file);
  if (c.fp16.enabled && c.bf16) file.problem("fp16.enabled and bf16.enabled are both true; choose one");
  top.refuse_if("amp", is_on, "NVIDIA apex AMP (amp.enabled)", "apex AMP is off");
  if (std::optional<Section> s = top.sub("data_types", Unknown::kIgnoreUnlessTypo)) {
    if (const int i = s->read_choice("grad_accum_dtype", kDTypeNames); i >= 0) c.grad_accum_dtype = dtype_at(i);
    s->finish();
  }
  // Gradients are reduced in the compute dtype; another one is a feature.
  if (const int i = top.read_choice("communication_data_type", kDTypeNames); i >= 0 && !(c.fp16.enabled && c.bf16)) {
    const DType compute = c.compute_dtype();
    if (dtype_at(i) != compute) {
      file.problem(fmt::format("communication_data_type is \"{}\": that asks for reducing gradients in {} while "
                               "computing in {}, which ZEST does not have (it reduces in the compute dtype); remove "
                               "the key",
                               kDTypeNames[static_cast<size_t>(i)], dtype_name(dtype_at(i)), dtype_name(compute)));
    }
  }
}

namespace {

EngineConfig parse(std::string_view text, const AutoValues& program, const std::string& source) {
  // A DeepSpeed file nests 4 levels at most (compression_training's groups);
  // 16 leaves room and keeps every later walk shallow. DeepSpeed reads it
  // with hjson.load, so comments and trailing commas are fine.
  const json j = detail::parse_json(text, source, {.max_depth = 16, .hjson = true});
  ZEST_CHECK(j.is_object(), "{}: the top level must be an object ({{...}}), got {}", source, j.type_name());
  EngineConfig cfg;
  FileState file{program, cfg, {}};
  Section top(file, j, "", Unknown::kIgnoreUnlessTypo);
  read_batch(top, file);
  const AutoRule<double> clip{program.gradient_clipping, "gradient_clipping"};
  top.read_double("gradient_clipping", cfg.gradient_clipping, 0.0, 1e38, &clip);
  read_zero(top, file);
  read_aio(top, file);
  read_precision(top, file);
  read_optimizer(top, file);
  read_scheduler(top, file);
  read_model_parallel(top, file);
  read_other_features(top, file);
  top.finish();
  const size_t problems = file.problems.size() + file.unlisted_problems;
  if (problems == 1) ZEST_FAIL("{}: {}", source, file.problems[0]);
  if (problems > 0) {
    std::string all;
    for (const std::string& p : file.problems) all += "\n  - " + p;
    if (file.unlisted_problems > 0) all += fmt::format("\n  - and {} more, not listed", file.unlisted_problems);
    ZEST_FAIL("{}: {} problems:{}", source, problems, all);
  }
  if (file.unlisted_ignored > 0) {
    cfg.ignored.push_back({"...", fmt::format("and {} more keys ignored, not listed", file.unlisted_ignored)});
  }
  return cfg;
}

}  // namespace
}  // namespace config_detail

EngineConfig parse_config_json(std::string_view json_text, const AutoValues& program) {
  return config_detail::parse(json_text, program, "config");
}

EngineConfig load_config_file(const std::string& path, const AutoValues& program) {
  std::string text;
  try {
    text = read_text_file(path);
  } catch (const Error& e) {
    ZEST_FAIL("config: {}", e.message());
  }
  return config_detail::parse(text, program, fmt::format("config '{}'", path));
}

}  // namespace zest
