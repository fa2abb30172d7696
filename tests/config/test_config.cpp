// DeepSpeed JSON files: supported keys parse with DeepSpeed's defaults;
// keys about what ZEST does not do are ignored with a reason; features ZEST
// lacks, unknown keys and bad values are errors that name them, all at once.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>

#include "zest/config/config.h"
#include "zest/core/check.h"
#include "config_test_helpers.h"

using namespace zest;
using zest::test::error_of;
using zest::test::ignored_reason;

namespace {

std::string file_error(const std::string& path) {
  try {
    (void)load_config_file(path, test::own_optimizer());
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace

TEST_CASE("a typical DeepSpeed ZeRO-2 file parses unchanged") {
  const EngineConfig c = test::parse(R"({
    "train_batch_size": 64,
    "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.0,
    "zero_optimization": {
      "stage": 2, "contiguous_gradients": true, "overlap_comm": true,
      "reduce_scatter": true, "reduce_bucket_size": 5e8, "allgather_bucket_size": 2e8
    },
    "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12,
             "loss_scale_window": 500, "hysteresis": 2, "min_loss_scale": 1},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                              "weight_decay": 0.1}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 3e-4,
                                                       "warmup_num_steps": 100, "total_num_steps": 1000}}
  })");
  CHECK(c.train_batch_size == 64);
  CHECK(c.gradient_accumulation_steps == 2);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.zero.stage == 2);
  CHECK(c.zero.overlap());
  CHECK(c.zero.reduce_bucket_size == 500000000);
  CHECK(c.zero.allgather_bucket_size == 200000000);
  CHECK(c.fp16.enabled);
  const LossScalerConfig ls = c.fp16.scaler();
  CHECK(ls.dynamic);
  CHECK(ls.initial_scale_power == 12);
  CHECK(ls.window == 500);
  CHECK(c.optimizer.kind == OptimizerKind::kAdamW);
  CHECK(c.optimizer.lr == doctest::Approx(3e-4));
  CHECK(c.optimizer.beta2 == doctest::Approx(0.95));
  CHECK(c.optimizer.weight_decay == doctest::Approx(0.1));
  CHECK(c.scheduler.kind == LrScheduleKind::kWarmupDecayLR);
  CHECK(c.scheduler.total_num_steps == 1000);
}

TEST_CASE("defaults are DeepSpeed's") {
  const EngineConfig c = test::parse("{}");
  CHECK(c.zero.stage == 0);
  CHECK_FALSE(c.zero.overlap());
  CHECK(c.zero.stage3_prefetch_bucket_size == 50000000);
  CHECK(c.zero.stage3_param_persistence_threshold == 100000);
  CHECK(c.zero.stage3_max_reuse_distance == 1000000000);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK_FALSE(c.gradient_accumulation_steps.has_value());  // derived by resolve_batch
  CHECK(c.accumulation_steps() == 1);
  CHECK(c.ignored.empty());
  CHECK(c.scheduler.kind == LrScheduleKind::kConstant);
  const EngineConfig z3 = test::parse(R"({"zero_optimization": {"stage": 3}})");
  CHECK(z3.zero.overlap());  // on by default for stage 3
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
  CHECK(test::parse(R"({"optimizer": {"type": "adam"}})").optimizer.kind == OptimizerKind::kAdamW);
  CHECK(test::parse(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
            .optimizer.kind == OptimizerKind::kAdam);
  const EngineConfig sgd = test::parse(
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})");
  CHECK(sgd.optimizer.kind == OptimizerKind::kSgd);
  CHECK(sgd.optimizer.nesterov);
  CHECK(sgd.optimizer.host_threads == 1);
  CHECK(test::parse(R"({"optimizer": {"type": "AdamW", "params": {"host_threads": 4}}})")
            .optimizer.host_threads == 4);
}

TEST_CASE("bad values name the key and what is allowed") {
  CHECK(error_of(R"({"zero_optimization": {"stage": 4}})") == "config: zero_optimization.stage is 4; allowed: 0 to 3");
  CHECK(error_of(R"({"fp16": {"enabled": "maybe"}})") == "config: fp16.enabled must be true or false, got \"maybe\"");
  CHECK(error_of(R"({"train_batch_size": 2.5})") == "config: train_batch_size must be a whole number, got 2.5");
  CHECK(error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})") ==
        "config: optimizer.params.betas must be a list of two numbers, got [0.9]");
  CHECK(error_of(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})") ==
        "config: fp16.enabled and bf16.enabled are both true; choose one");
  CHECK(error_of("[1, 2]") == "config: the top level must be an object ({...}), got array");
  CHECK(error_of(R"({"zero_optimization": 3})") ==
        "config: zero_optimization must be an object ({...}) or true/false, got 3");
  // 2^63 is too large, not negative (nlohmann holds it as unsigned).
  CHECK(error_of(R"({"train_batch_size": 9223372036854775808})") ==
        "config: train_batch_size is 9223372036854775808, above the largest 64-bit integer (9223372036854775807)");
  CHECK(error_of(R"({"train_batch_size": -3})") == "config: train_batch_size is -3; allowed: 1 to 1125899906842624");
  CHECK(error_of(R"({"train_batch_size": 1e20})") == "config: train_batch_size must be a whole number, got 1e+20");
}

TEST_CASE("a key DeepSpeed refuses is refused with the names allowed and the nearest one") {
  // zero_optimization is a pydantic model with extra="forbid" in DeepSpeed.
  const std::string zero = error_of(R"({"zero_optimization": {"stgae": 2}})");
  CHECK(zero.starts_with("config: unknown key 'zero_optimization.stgae' in zero_optimization (did you mean "
                         "'stage'?); DeepSpeed accepts here: allgather_bucket_size, allgather_partitions, "));
  CHECK(zero.find("stage3_max_reuse_distance") != std::string::npos);
  CHECK(zero.find("max_reuse_distance") != std::string::npos);  // the alias too
  // Optimizer params are keyword arguments of FusedAdam: an unknown one fails.
  CHECK(error_of(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})")
            .starts_with("config: unknown key 'optimizer.params.momentum' in optimizer.params; DeepSpeed accepts "
                         "here: "));
  CHECK(error_of(R"({"optimizer": {"type": "AdamW", "params": {"lrr": 0.1}}})")
            .starts_with("config: unknown key 'optimizer.params.lrr' in optimizer.params (did you mean 'lr'?)"));
  CHECK(error_of(R"({"tensorboard": {"enabeld": true}})")
            .starts_with("config: unknown key 'tensorboard.enabeld' in tensorboard (did you mean 'enabled'?); "
                         "DeepSpeed accepts here: enabled, job_name, output_path"));
  // The top level is read with dict lookups: DeepSpeed skips a typo there
  // silently; ZEST skips it too, with a warning naming it.
  const EngineConfig typo = test::parse(R"({"train_batch_szie": 8, "gradient_accumulation_steps": 2})");
  REQUIRE(typo.warnings.size() == 1);
  CHECK(typo.warnings[0].key == "train_batch_szie");
  CHECK(typo.warnings[0].text ==
        "an unknown key in the top level (did you mean 'train_batch_size'?): skipped, as DeepSpeed skips it silently; "
        "correct it, or remove it");
  CHECK(typo.gradient_accumulation_steps == 2);
  CHECK(error_of(R"({"optimizer": {"type": "AdamX"}})") ==
        "config: optimizer.type is \"AdamX\", which is no optimizer DeepSpeed knows (did you mean \"AdamW\"?); ZEST "
        "has AdamW, Adam, SGD, Lamb");
  CHECK(error_of(R"({"optimizer": {"type": "AdamW", "params": {"max_grad_norm": 1.0}}})") ==
        "config: optimizer.params.max_grad_norm is 1.0: DeepSpeed refuses max_grad_norm as an optimizer parameter; "
        "write it as the top-level gradient_clipping");
}

TEST_CASE("a feature ZEST lacks is refused by name, never as an unknown key") {
  struct Case {
    const char* json;
    const char* feature;
  };
  const Case cases[] = {
      {R"({"aio": {"use_gds": true}})", "GPUDirect Storage"},
      {R"({"optimizer": {"type": "OneBitLamb", "params": {"lr": 0.1, "max_coeff": 0.3}}})", "1-bit LAMB"},
      {R"({"optimizer": {"type": "Lamb", "params": {"amsgrad": true}}})", "the AMSGrad variant (FusedLamb"},
      {R"({"optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}}})", "FusedLamb's own clipping"},
      {R"({"optimizer": {"type": "OneBitAdam"}})", "1-bit Adam"},
      {R"({"optimizer": {"type": "RMSprop"}})", "torch.optim.RMSprop"},
      {R"({"optimizer": {"type": "AdamW", "params": {"amsgrad": true}}})", "the AMSGrad variant of Adam"},
      {R"({"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0}}})", "DeepSpeed's OneCycle schedule"},
      {R"({"scheduler": {"type": "StepLR"}})", "torch.optim.lr_scheduler.StepLR"},
      {R"({"curriculum_learning": {"enabled": true}})", "curriculum learning"},
      {R"({"sparse_gradients": true})", "sparse gradients"},
      {R"({"compression_training": {"weight_quantization": {"shared_parameters": {"enabled": true}}}})",
       "compression training"},
      {R"({"zero_optimization": {"stage": 3, "zero_quantized_weights": true}})", "ZeRO++ quantized weight gathers"},
      {R"({"amp": {"enabled": true, "opt_level": "O2"}})", "NVIDIA apex AMP"},
      {R"({"bf16": {"enabled": true}, "communication_data_type": "fp32"})", "reducing gradients in fp32"},
      {R"({"fp16": {"enabled": true, "fp16_master_weights_and_grads": true}})", "fp16 master weights"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.json);
    const std::string e = error_of(c.json);
    CHECK(e.find(c.feature) != std::string::npos);
    CHECK(e.find("ZEST does not have") != std::string::npos);
    CHECK(e.find("unknown") == std::string::npos);
  }
  // Off, the same keys are fine: offload to "none", a feature's enabled
  // false, DeepSpeed's default values.
  const EngineConfig off = test::parse(R"({
    "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "pin_memory": true},
                          "offload_param": {"device": "none"}, "cpu_offload_use_pin_memory": false},
    "curriculum_learning": {"enabled": false}, "prescale_gradients": false, "gradient_predivide_factor": 1.0,
    "activation_checkpointing": {"partition_activations": false, "profile": true},
    "communication_data_type": null, "sparse_gradients": false})");
  CHECK(off.zero.stage == 3);
  CHECK(ignored_reason(off, "zero_optimization.offload_optimizer") == "device \"none\": nothing is offloaded");
  CHECK(off.offload_optimizer.device == OffloadDevice::kNone);
  CHECK(off.offload_optimizer.pin_memory);  // read, though nothing is offloaded
  CHECK(ignored_reason(off, "curriculum_learning") == "curriculum learning is off");
  // DeepSpeed offloads parameters only at stage 3.
  const EngineConfig z0 = test::parse(R"({"zero_optimization": {"stage": 0, "offload_param": {"device": "cpu"}}})");
  CHECK(ignored_reason(z0, "zero_optimization.offload_param") ==
        "DeepSpeed offloads parameters only at stage 3; this is stage 0, so nothing is offloaded");
  CHECK(z0.offload_param.device == OffloadDevice::kNone);
}

TEST_CASE("activation_checkpointing: cpu_checkpointing honoured, the other keys noted with why, typos refused") {
  const EngineConfig c = test::parse(R"({"activation_checkpointing": {"partition_activations": true,
      "cpu_checkpointing": true, "contiguous_memory_optimization": false, "number_checkpoints": 4,
      "synchronize_checkpoint_boundary": false, "profile": false}})");
  CHECK(c.checkpoint_in_host_memory);
  CHECK(ignored_reason(c, "activation_checkpointing.partition_activations").find("one model-parallel rank") !=
        std::string::npos);
  CHECK(ignored_reason(c, "activation_checkpointing.number_checkpoints").find("buffer") != std::string::npos);
  CHECK_FALSE(test::parse(R"({"activation_checkpointing": {"profile": true}})").checkpoint_in_host_memory);
  CHECK(error_of(R"({"activation_checkpointing": {"cpu_checkpionting": true}})").find("cpu_checkpionting") !=
        std::string::npos);
}

TEST_CASE("tensor_parallel and pipeline: the sizes kept for the estimator, the keys noted, typos refused") {
  const EngineConfig c = test::parse(R"({"tensor_parallel": {"autotp_size": 8, "tp": {"tp_size": 8},
      "preset_model": "llama"}, "pipeline": {"stages": 16, "partition": "parameters", "pipe_partitioned": true}})");
  CHECK(c.tensor_parallel_size == 8);
  CHECK(c.pipeline_stages == 16);
  CHECK(ignored_reason(c, "tensor_parallel.autotp_size").find("ZEST splits no model from a file") != std::string::npos);
  CHECK(ignored_reason(c, "pipeline.stages").find("PipelineModule(num_stages)") != std::string::npos);
  CHECK(ignored_reason(c, "tensor_parallel.preset_model").find("AutoTP") != std::string::npos);
  CHECK(ignored_reason(c, "pipeline.partition").find("PipelineModule") != std::string::npos);
  // DeepSpeed's defaults: autotp_size 0 (off) and stages "auto", one stage.
  const EngineConfig d = test::parse(R"({"tensor_parallel": {"autotp_size": 0}, "pipeline": {"stages": "auto"}})");
  CHECK(d.tensor_parallel_size == 1);
  CHECK(d.pipeline_stages == 1);
  // tp.tp_size must be 1 or autotp_size, as DeepSpeed requires.
  CHECK(error_of(R"({"tensor_parallel": {"autotp_size": 4, "tp": {"tp_size": 2}}})")
            .find("tensor_parallel.tp.tp_size is 2 and tensor_parallel.autotp_size 4") != std::string::npos);
  // The section is a pydantic model: a misspelt key is refused, as DeepSpeed refuses it.
  CHECK(error_of(R"({"tensor_parallel": {"autotp_szie": 4}})").find("did you mean 'autotp_size'") != std::string::npos);
  CHECK(error_of(R"({"pipeline": {"stages": 0}})").find("pipeline.stages is 0; allowed: 1 to") != std::string::npos);
}

TEST_CASE("keys about what ZEST does not do are accepted and listed with the reason") {
  const EngineConfig c = test::parse(R"({
    "steps_per_print": 10, "wall_clock_breakdown": false, "zero_allow_untested_optimizer": true,
    "tensorboard": {"enabled": true, "output_path": "/tmp/tb"}, "flops_profiler": {"enabled": true},
    "zero_optimization": {"stage": 3, "sub_group_size": 1e9,
                          "stage3_gather_16bit_weights_on_model_save": true, "round_robin_gradients": true},
    "cuda_visible_devices": 0, "_comment": "x"})");
  const std::vector<std::string> keys = {
      "zero_optimization.stage3_gather_16bit_weights_on_model_save", "zero_optimization.sub_group_size",
      "zero_optimization.round_robin_gradients",
      "flops_profiler",                             "zero_allow_untested_optimizer",
      "tensorboard",                                "cuda_visible_devices",
      "_comment"};
  std::vector<std::string> got;
  for (const ConfigNote& n : c.ignored) got.push_back(n.key);
  std::sort(got.begin(), got.end());
  std::vector<std::string> want = keys;
  std::sort(want.begin(), want.end());
  CHECK(got == want);
  // Read, not ignored: the Engine's progress lines.
  CHECK(c.steps_per_print == 10);
  // DeepSpeed takes any positive count, a float of whole value too.
  CHECK(test::parse(R"({"steps_per_print": 2e16})").steps_per_print == int64_t{20000000000000000});
  CHECK_FALSE(c.wall_clock_breakdown);
  CHECK(ignored_reason(c, "cuda_visible_devices") == "DeepSpeed does not read this key either");
  CHECK(ignored_reason(c, "_comment") == "a comment");
}

TEST_CASE("aliases and DeepSpeed's older names") {
  const EngineConfig c = test::parse(R"({"bfloat16": {"enabled": true},
    "zero_optimization": {"stage": 3, "max_live_parameters": 7, "prefetch_bucket_size": 11,
                          "param_persistence_threshold": 13, "max_reuse_distance": 17,
                          "stage3_gather_fp16_weights_on_model_save": true}})");
  CHECK(c.bf16);
  CHECK(c.zero.stage3_max_reuse_distance == 17);
  CHECK(test::parse(R"({"zero_optimization": {"stage3_max_reuse_distance": 1e9}})").zero.stage3_max_reuse_distance ==
        1000000000);
  CHECK(error_of(R"({"zero_optimization": {"stage3_max_reuse_distance": -1}})") ==
        "config: zero_optimization.stage3_max_reuse_distance is -1; allowed: 0 to 1125899906842624");
  CHECK(c.zero.stage3_max_live_parameters == 7);
  CHECK(c.zero.stage3_prefetch_bucket_size == 11);
  CHECK(c.zero.stage3_param_persistence_threshold == 13);
  CHECK(error_of(R"({"zero_optimization": {"max_live_parameters": 7, "stage3_max_live_parameters": 8}})") ==
        "config: zero_optimization.stage3_max_live_parameters and zero_optimization.max_live_parameters are two "
        "names for one setting: write only one");
  CHECK(error_of(R"({"bf16": {"enabled": true}, "bfloat16": {"enabled": true}})") ==
        "config: bf16 and bfloat16 are two names for one setting: write only one");
  // The deprecated boolean form: true is stage 1 with allgather_size.
  const EngineConfig old = test::parse(R"({"zero_optimization": true, "allgather_size": 1000})");
  CHECK(old.zero.stage == 1);
  CHECK(old.zero.allgather_bucket_size == 1000);
  // bf16 with fp16's loss-scale keys (DeepSpeed reads them only under fp16).
  const EngineConfig b = test::parse(R"({"bf16": {"enabled": true, "loss_scale": 0, "hysteresis": 2}})");
  CHECK(ignored_reason(b, "bf16.loss_scale") ==
        "an fp16 setting: bf16 needs no loss scale, and DeepSpeed reads it only under fp16");
  // DeepSpeed allows bucket sizes of 0: reduce at once, which ZEST spells 1.
  CHECK(test::parse(R"({"zero_optimization": {"reduce_bucket_size": 0}})").zero.reduce_bucket_size == 1);
}

TEST_CASE("every problem of a file is listed in one error, each with its key path") {
  const std::string e = error_of(R"({
    "train_batch_size": "lots", "zero_optimization": {"stage": 3, "stage3_prefetch_bucket_size": -1,
    "offload_param": {"device": "nvme"}, "stgae": 1}, "fp16": {"enabled": 2}, "optimizer": {"type": "Adagrad"},
    "steps_per_print": 10})");
  CHECK(e == "config: 6 problems:\n"
             "  - train_batch_size must be a whole number, got \"lots\"\n"
             "  - zero_optimization.stage3_prefetch_bucket_size is -1; allowed: 0 to 1125899906842624\n"
             "  - zero_optimization.offload_param.device is \"nvme\" without "
             "zero_optimization.offload_param.nvme_path: name the directory on the NVMe drive where the swap files "
             "go\n"
             "  - " + error_of(R"({"zero_optimization": {"stgae": 1}})").substr(8) + "\n"
             "  - fp16.enabled must be true or false, got 2\n"
             "  - optimizer.type is \"Adagrad\": that asks for the Adagrad optimizer, which ZEST does not have; it "
             "has AdamW, Adam, SGD, Lamb");
}

TEST_CASE("a static fp16 loss scale that overflows every gradient is refused") {
  CHECK(error_of(R"({"fp16": {"enabled": true, "loss_scale": 1e38}})") ==
        "config: fp16.loss_scale is 1e+38: a static loss scale above 1.099e+12 (65504 / 2^-24) overflows every "
        "gradient fp16 can hold, so every step would be skipped; use 0 (dynamic) or a scale such as 2^16");
  CHECK(test::parse(R"({"fp16": {"enabled": true, "loss_scale": 4294967296}})").fp16.scaler().static_scale ==
        4294967296.0);
  CHECK(test::parse(R"({"fp16": {"enabled": true, "loss_scale": 0}})").fp16.scaler().dynamic);
}

TEST_CASE("data_types.grad_accum_dtype takes DeepSpeed's spellings") {
  CHECK_FALSE(test::parse("{}").grad_accum_dtype.has_value());
  CHECK(test::parse(R"({"data_types": {"grad_accum_dtype": "fp32"}})").grad_accum_dtype == DType::kFloat32);
  CHECK(test::parse(R"({"data_types": {"grad_accum_dtype": "bf16"}})").grad_accum_dtype == DType::kBFloat16);
  CHECK(test::parse(R"({"data_types": {"grad_accum_dtype": "half"}})").grad_accum_dtype == DType::kFloat16);
  CHECK(error_of(R"({"data_types": {"grad_accum_dtype": "int8"}})")
            .starts_with("config: data_types.grad_accum_dtype is \"int8\"; allowed: fp32, "));
}

TEST_CASE("config files are read, and errors name the file") {
  const std::string path = "zest_test_config.json";
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}})";
  }
  const EngineConfig c = load_config_file(path, test::own_optimizer());
  CHECK(c.zero.stage == 1);
  CHECK(c.bf16);
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 9}})";
  }
  CHECK(file_error(path) == "config 'zest_test_config.json': zero_optimization.stage is 9; allowed: 0 to 3");
  {
    std::ofstream out(path);
    out << R"({"gradient_clipping": 1e400})";
  }
  CHECK(file_error(path) == "config 'zest_test_config.json': byte 27 (at gradient_clipping): the number 1e400 is "
                            "beyond a double's range (about 1.8e308)");
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(load_config_file("/nonexistent/ds.json", test::own_optimizer()),
                       doctest::Contains("cannot open '/nonexistent/ds.json'"),
                       Error);
}
