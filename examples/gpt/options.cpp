#include "options.h"

#include <string_view>

#include <fmt/format.h>

#include "common/default_config.h"

namespace gpt {

std::string usage() {
  return "usage: gpt [--ranks N] [--stage S | --stages 0,1,2,3] [--launch] [--dtype fp32|bf16|fp16] [--offload]\n"
         "           [--offload-param]\n"
         "           [--config ds_config.json] [--steps N] [--batch ROWS] [--accum N] [--lr X]\n"
         "           [--warmup N] [--schedule-steps N] [--seed N] [--threads N]\n"
         "           [--layers N] [--heads N] [--d-model N] [--context N] [--vocab N] [--untied]\n"
         "           [--data FORTUNE_FILE_OR_DIR] [--eval-every N] [--val-windows N] [--print-every N]\n"
         "           [--save CKPT_ROOT [--save-total-limit N]] [--load CKPT_ROOT] [--export MODEL.safetensors]\n"
         "           [--sample-bytes N] [--temperature T] [--sample-seed N] [--prompt TEXT]\n"
         "           [--timeout SECONDS] [--lora R] [--lora-alpha A] [--hf DIR] [--export-hf DIR]\n"
         "           [--max-shard-size BYTES] [--export-dtype fp32|bf16|fp16] [--export-adapters]\n"
         "           [--export-replace]\n"
         "           [--digest] [--device host|cuda[:N]] [--tp N] [--pp N] [--pipeline-schedule 1f1b|gpipe]\n"
         "GPT-2 small: --layers 12 --heads 12 --d-model 768 --context 1024 --vocab 50257\n"
         "--tp and --pp: ranks = dp x tp x pp (Megatron's order); tp divides --heads and --vocab, pp is at most\n"
         "--layers, and --accum sets the pipeline's micro-batches.\n"
         "--ranks: in-process ranks, 2 by default; 1 with --device cuda, where in-process ranks cannot share\n"
         "the GPU (libtorch runs its backward on one thread): --launch one process a GPU instead.\n"
         "Without --config, stage 3 prefetches up to 0.9 x d_model^2 elements ahead and keeps a released unit\n"
         "gathered for a reuse within 0.9 x d_model^2 elements (stage3_prefetch_bucket_size,\n"
         "stage3_max_reuse_distance); a --config file has DeepSpeed's defaults, 5e7 and 1e9, unless it sets them.\n";
}

Options parse_options(int argc, char** argv) {
  Options o;
  cli::App app("gpt");
  int stage = -1;
  std::vector<int> stages;
  bool untied = false;
  std::string shard_size;
  examples::add_lm_run_flags(app, o);
  examples::add_pretrained_flags(app, o, shard_size);
  app.add_flag("--untied", untied);
  app.add_flag("--offload-param", o.offload_param);
  app.add_flag("--digest", o.digest);
  cli::Option* one = app.add_option("--stage", stage)->check(cli::Range(0, 3));
  app.add_option("--stages", stages)->delimiter(',')->check(cli::Range(0, 3))->excludes(one);
  app.add_option("--dtype", o.dtype)->check(cli::IsMember({"fp32", "bf16", "fp16"}));
  app.add_option("--config", o.config_path);
  app.add_option("--accum", o.accum)->check(cli::Range(1, 1 << 20));
  app.add_option("--warmup", o.warmup)->check(cli::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--schedule-steps", o.schedule_steps)->check(cli::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--layers", o.model.layers)->check(cli::Range(int64_t{1}, int64_t{1} << 12));
  app.add_option("--heads", o.model.heads)->check(cli::Range(int64_t{1}, int64_t{1} << 12));
  app.add_option("--d-model", o.model.d_model)->check(cli::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--context", o.model.context)->check(cli::Range(int64_t{1}, int64_t{1} << 16));
  app.add_option("--vocab", o.model.vocab)->check(cli::Range(int64_t{256}, int64_t{1} << 20));
  app.add_option("--export", o.export_path);
  app.add_option("--sample-bytes", o.sample.length)->check(cli::Range(int64_t{0}, int64_t{1} << 20));
  app.add_option("--temperature", o.sample.temperature)->check(cli::real_range(0, 100));
  app.add_option("--sample-seed", o.sample.seed);
  app.add_option("--prompt", o.prompt);
  std::string device_name;
  app.add_option("--device", device_name);
  std::string schedule;
  examples::add_mesh_flags(app, o, schedule);
  cli::parse(app, argc, argv);
  if (o.save_total_limit > 0 && o.save_dir.empty()) {
    cli::usage_error("--save-total-limit needs --save: the checkpoint root whose last N checkpoints to keep");
  }
  examples::finish_mesh_flags(o, schedule);
  if (!device_name.empty()) o.device = cli::device_flag("--device", device_name);
  // In-process ranks cannot share a GPU through libtorch (its backward for a
  // GPU runs on one thread: zest::backward_thread_conflict), so on one the
  // default is one rank; a --ranks above 1 is refused by name there.
  if (o.device.is_cuda() && !o.launch && app.count("--ranks") == 0 && !o.mesh()) o.ranks = 1;
  if (stage >= 0) o.stages = {stage};
  if (!stages.empty()) o.stages = stages;
  if (untied) o.model.tied_head = false;
  examples::finish_pretrained_flags(o, shard_size);
  if (!o.hf_dir.empty()) {
    // The checkpoint's sizes (an export of this example: Config::to_json).
    try {
      o.model = Config::from_json_file(o.hf_dir + "/config.json", &o.pretrained_dtype);
    } catch (const std::exception& e) {
      cli::usage_error("--hf {}: {}", o.hf_dir, e.what());
    }
  }
  if (o.model.d_model % o.model.heads != 0) {
    cli::usage_error("--d-model {} does not divide into --heads {}", o.model.d_model, o.model.heads);
  }
  if (o.mesh()) {
    if (o.model.heads % o.tp != 0 || o.model.vocab % o.tp != 0) {
      cli::usage_error("--tp {} must divide --heads {} and --vocab {}: each rank takes whole heads and an equal "
                       "slice of the vocabulary",
                       o.tp, o.model.heads, o.model.vocab);
    }
    if (o.pp > o.model.layers) {
      cli::usage_error("--pp {} is more stages than the {} layers (--layers): each stage needs a block", o.pp,
                       o.model.layers);
    }
    // Each rank holds a part of the model: a digest of the weights does not
    // know the mesh yet. (--hf reads each rank's tp slices, hf/hf_import.h;
    // --lora puts the adapters on the split layers, torch/tensor_parallel.h;
    // --save and --load keep a part per tp x pp rank, checkpoint/
    // model_parallel_parts.h; --export and --export-hf write the whole
    // model, checkpoint/whole_model.h.)
    if (o.digest) {
      cli::usage_error("--digest with --tp/--pp: digests of a model split over a mesh are not supported yet; run it "
                       "with --tp 1 --pp 1");
    }
  }
  return o;
}

zest::EngineConfig engine_config(const Options& opt, int stage, int world) {
  zest::EngineConfig c = examples::default_engine_config(opt.lr);
  c.optimizer.beta2 = 0.95f;
  c.optimizer.weight_decay = 0.1f;
  c.scheduler.kind = zest::LrScheduleKind::kWarmupCosineLR;
  c.scheduler.warmup_num_steps = std::max<int64_t>(opt.warmup, 2);  // DeepSpeed's least
  c.scheduler.warmup_type = zest::WarmupType::kLinear;
  const int64_t span = opt.schedule_steps > 0 ? opt.schedule_steps : opt.steps;
  c.scheduler.total_num_steps = std::max(span, c.scheduler.warmup_num_steps + 1);
  c.scheduler.cos_min_ratio = 0.1;
  if (!opt.config_path.empty()) {
    // The example's own optimizer and schedule, for a file without those
    // sections (DeepSpeed steps the program's then).
    zest::AutoValues program;
    program.optimizer = c.optimizer;
    program.scheduler = c.scheduler;
    c = zest::load_config_file(opt.config_path, program);
  } else {
    examples::set_stage3_windows(c, opt.model.d_model);  // it says why
  }
  c.zero.stage = stage;
  if (opt.offload) {
    // ZeRO-Offload moves the owned shard of the optimizer state; stage 0
    // owns no shard (DeepSpeed refuses it too).
    if (stage == 0) throw UsageError("--offload needs --stage 1, 2 or 3: stage 0 shards no optimizer state to offload");
    c.offload_optimizer.device = zest::OffloadDevice::kCpu;
  }
  if (opt.offload_param) {
    if (stage != 3) throw UsageError("--offload-param needs --stage 3: stages 0-2 keep every parameter on every rank");
    // ZEST offloads parameters with the whole optimizer (engine.h).
    c.offload_optimizer.device = zest::OffloadDevice::kCpu;
    c.offload_optimizer.ratio = 1.0;
    c.offload_param.device = zest::OffloadDevice::kCpu;
  }
  if (opt.accum > 0) c.gradient_accumulation_steps = opt.accum;
  if (!opt.dtype.empty()) examples::set_compute_dtype(c, opt.dtype);
  if (opt.batch % (world * c.accumulation_steps()) != 0) {
    throw UsageError(fmt::format("--batch {} does not divide into {} ranks x {} micro-steps", opt.batch, world,
                                 c.accumulation_steps()));
  }
  return c;
}

}  // namespace gpt
