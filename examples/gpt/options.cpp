#include "options.h"

#include <string_view>

#include <fmt/format.h>

#include "common/default_config.h"

namespace gpt {
using cli::number;
using cli::number_list;

namespace {

double real(std::string_view flag, std::string_view text, double min, double max) {
  try {
    size_t end = 0;
    const double v = std::stod(std::string(text), &end);
    if (end == text.size() && v >= min && v <= max) return v;
  } catch (const std::exception&) {
  }
  cli::usage_error("{} '{}': expected a number from {} to {}", flag, text, min, max);
}

}  // namespace

std::string usage() {
  return "usage: gpt [--ranks N] [--stage S | --stages 0,1,2,3] [--launch] [--dtype fp32|bf16|fp16]\n"
         "           [--config ds_config.json] [--steps N] [--batch ROWS] [--accum N] [--lr X]\n"
         "           [--warmup N] [--schedule-steps N] [--seed N] [--threads N]\n"
         "           [--layers N] [--heads N] [--d-model N] [--context N] [--vocab N] [--untied]\n"
         "           [--data FORTUNE_FILE_OR_DIR] [--eval-every N] [--val-windows N] [--print-every N]\n"
         "           [--save CKPT_ROOT] [--load CKPT_ROOT] [--export MODEL.safetensors]\n"
         "           [--sample-bytes N] [--temperature T] [--sample-seed N] [--prompt TEXT]\n"
         "GPT-2 small: --layers 12 --heads 12 --d-model 768 --context 1024 --vocab 50257\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::for_each_flag(argc, argv, {"--launch", "--untied"}, [&](std::string_view flag, std::string_view v) {
    if (flag == "--launch") o.launch = true;
    else if (flag == "--untied") o.model.tied_head = false;
    else if (flag == "--ranks") o.ranks = number<int>(flag, v, 1, 1 << 16);
    else if (flag == "--stage") o.stages = {number<int>(flag, v, 0, 3)};
    else if (flag == "--stages") o.stages = number_list(flag, v, 0, 3);
    else if (flag == "--dtype") o.dtype = examples::dtype_flag(flag, v);
    else if (flag == "--config") o.config_path = v;
    else if (flag == "--steps") o.steps = number<int64_t>(flag, v, 0, int64_t{1} << 40);
    else if (flag == "--batch") o.batch = number<int64_t>(flag, v, 1, 1 << 20);
    else if (flag == "--accum") o.accum = number<int>(flag, v, 1, 1 << 20);
    else if (flag == "--lr") o.lr = static_cast<float>(real(flag, v, 0.0, 10.0));
    else if (flag == "--warmup") o.warmup = number<int64_t>(flag, v, 0, int64_t{1} << 40);
    else if (flag == "--schedule-steps") o.schedule_steps = number<int64_t>(flag, v, 1, int64_t{1} << 40);
    else if (flag == "--seed") o.seed = number<uint64_t>(flag, v, 0, ~uint64_t{0});
    else if (flag == "--threads") o.threads = number<int>(flag, v, 1, 1024);
    else if (flag == "--layers") o.model.layers = number<int64_t>(flag, v, 1, 1 << 12);
    else if (flag == "--heads") o.model.heads = number<int64_t>(flag, v, 1, 1 << 12);
    else if (flag == "--d-model") o.model.d_model = number<int64_t>(flag, v, 1, 1 << 16);
    else if (flag == "--context") o.model.context = number<int64_t>(flag, v, 1, 1 << 16);
    else if (flag == "--vocab") o.model.vocab = number<int64_t>(flag, v, 256, 1 << 20);
    else if (flag == "--data") o.data = v;
    else if (flag == "--eval-every") o.eval_every = number<int64_t>(flag, v, 1, int64_t{1} << 40);
    else if (flag == "--val-windows") o.val_windows = number<int64_t>(flag, v, 1, int64_t{1} << 30);
    else if (flag == "--print-every") o.print_every = number<int64_t>(flag, v, 1, int64_t{1} << 40);
    else if (flag == "--save") o.save_dir = v;
    else if (flag == "--load") o.load_dir = v;
    else if (flag == "--export") o.export_path = v;
    else if (flag == "--sample-bytes") o.sample.length = number<int64_t>(flag, v, 0, 1 << 20);
    else if (flag == "--temperature") o.sample.temperature = real(flag, v, 0.0, 100.0);
    else if (flag == "--sample-seed") o.sample.seed = number<uint64_t>(flag, v, 0, ~uint64_t{0});
    else if (flag == "--prompt") o.prompt = v;
    else cli::usage_error("unknown option {}", flag);
  });
  if (o.model.d_model % o.model.heads != 0) {
    cli::usage_error("--d-model {} does not divide into --heads {}", o.model.d_model, o.model.heads);
  }
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage, int world) {
  zest::EngineConfig c;
  if (opt.config_path.empty()) {
    c = examples::default_engine_config(opt.lr);
    c.optimizer.beta2 = 0.95f;
    c.optimizer.weight_decay = 0.1f;
    c.scheduler.kind = zest::LrScheduleKind::kWarmupCosineLR;
    c.scheduler.warmup_num_steps = std::max<int64_t>(opt.warmup, 2);  // DeepSpeed's least
    c.scheduler.warmup_type = zest::WarmupType::kLinear;
    const int64_t span = opt.schedule_steps > 0 ? opt.schedule_steps : opt.steps;
    c.scheduler.total_num_steps = std::max(span, c.scheduler.warmup_num_steps + 1);
    c.scheduler.cos_min_ratio = 0.1;
  } else {
    c = zest::load_config_file(opt.config_path);
  }
  c.zero.stage = stage;
  if (opt.accum > 0) c.gradient_accumulation_steps = opt.accum;
  if (!opt.dtype.empty()) examples::set_compute_dtype(c, opt.dtype);
  if (opt.batch % (world * c.gradient_accumulation_steps) != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} ranks x {} micro-steps", opt.batch, world,
                                 c.gradient_accumulation_steps));
  }
  return c;
}

}  // namespace gpt
