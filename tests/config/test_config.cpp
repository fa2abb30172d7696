// DeepSpeed JSON files: supported keys parse with DeepSpeed's defaults; any
// other key or a bad value is an error that names it and what is allowed.
#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>

#include "zest/core/check.h"
#include "zest/config/config.h"

using namespace zest;

TEST_CASE("a typical DeepSpeed ZeRO-2 file parses unchanged") {
  const EngineConfig c = parse_config_json(R"({
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
  const EngineConfig c = parse_config_json("{}");
  CHECK(c.zero.stage == 0);
  CHECK_FALSE(c.zero.overlap());
  CHECK(c.zero.stage3_prefetch_bucket_size == 50000000);
  CHECK(c.zero.stage3_param_persistence_threshold == 100000);
  CHECK(c.fp16.initial_scale_power == 16);
  CHECK(c.fp16.loss_scale_window == 1000);
  CHECK(c.fp16.hysteresis == 2);
  CHECK(c.gradient_accumulation_steps == 1);
  CHECK(c.scheduler.kind == LrScheduleKind::kConstant);
  const EngineConfig z3 = parse_config_json(R"({"zero_optimization": {"stage": 3}})");
  CHECK(z3.zero.overlap());  // on by default for stage 3
  // DeepSpeed's "Adam" is AdamW unless adam_w_mode is false.
  CHECK(parse_config_json(R"({"optimizer": {"type": "adam"}})").optimizer.kind == OptimizerKind::kAdamW);
  CHECK(parse_config_json(R"({"optimizer": {"type": "Adam", "params": {"adam_w_mode": false}}})")
            .optimizer.kind == OptimizerKind::kAdam);
  const EngineConfig sgd = parse_config_json(
      R"({"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true}}})");
  CHECK(sgd.optimizer.kind == OptimizerKind::kSgd);
  CHECK(sgd.optimizer.nesterov);
  CHECK(sgd.optimizer.host_threads == 1);
  CHECK(parse_config_json(R"({"optimizer": {"type": "AdamW", "params": {"host_threads": 4}}})")
            .optimizer.host_threads == 4);
}

TEST_CASE("unknown keys and bad values name the key and what is allowed") {
  auto error_of = [](const char* text) {
    try {
      (void)parse_config_json(text);
    } catch (const Error& e) {
      return e.message();
    }
    return std::string("no error");
  };
  CHECK(error_of(R"({"zero_optimization": {"stage": 4}})") ==
        "config: zero_optimization.stage is 4; allowed: 0 to 3");
  CHECK(error_of(R"({"zero_optimization": {"stgae": 2}})").starts_with(
      "config: unknown key 'zero_optimization.stgae' in zero_optimization; ZEST accepts: "
      "allgather_bucket_size, allgather_partitions, contiguous_gradients,"));
  CHECK(error_of(R"({"offload": true})").starts_with("config: unknown key 'offload' in the top level"));
  CHECK(error_of(R"({"optimizer": {"type": "Lamb"}})") ==
        "config: optimizer.type is \"Lamb\"; allowed: AdamW, Adam, SGD");
  CHECK(error_of(R"({"fp16": {"enabled": "yes"}})") ==
        "config: fp16.enabled must be true or false, got \"yes\"");
  CHECK(error_of(R"({"train_batch_size": "auto"})").find("placeholder") != std::string::npos);
  CHECK(error_of(R"({"train_batch_size": 2.5})") ==
        "config: train_batch_size must be a whole number, got 2.5");
  CHECK(error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9]}}})")
            .find("betas must be a list of two numbers") != std::string::npos);
  CHECK(error_of(R"({"optimizer": {"type": "AdamW", "params": {"momentum": 0.9}}})")
            .starts_with("config: unknown key 'optimizer.params.momentum'"));
  CHECK(error_of(R"({"fp16": {"enabled": true}, "bf16": {"enabled": true}})") ==
        "config: fp16.enabled and bf16.enabled are both true; choose one");
  CHECK(error_of(R"({"zero_optimization": {"reduce_scatter": false}})").find("not supported") !=
        std::string::npos);
  CHECK(error_of("{\"stage\": ").starts_with("config: not valid JSON"));
  CHECK(error_of("[1, 2]") == "config: the top level must be an object ({...}), got array");
}

TEST_CASE("data_types.grad_accum_dtype takes DeepSpeed's spellings") {
  CHECK_FALSE(parse_config_json("{}").grad_accum_dtype.has_value());
  CHECK(parse_config_json(R"({"data_types": {"grad_accum_dtype": "fp32"}})").grad_accum_dtype ==
        DType::kFloat32);
  CHECK(parse_config_json(R"({"data_types": {"grad_accum_dtype": "bf16"}})").grad_accum_dtype ==
        DType::kBFloat16);
  CHECK(parse_config_json(R"({"data_types": {"grad_accum_dtype": "half"}})").grad_accum_dtype ==
        DType::kFloat16);
  CHECK_THROWS_WITH_AS(parse_config_json(R"({"data_types": {"grad_accum_dtype": "int8"}})"),
                       doctest::Contains("data_types.grad_accum_dtype is \"int8\""), Error);
}

TEST_CASE("batch sizes resolve like DeepSpeed's") {
  EngineConfig a = parse_config_json(R"({"train_batch_size": 32, "gradient_accumulation_steps": 2})");
  a.resolve_batch(4);
  CHECK(a.train_micro_batch_size_per_gpu == 4);
  EngineConfig b = parse_config_json(R"({"train_micro_batch_size_per_gpu": 3})");
  b.resolve_batch(2);
  CHECK(b.train_batch_size == 6);
  EngineConfig bad = parse_config_json(R"({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4})");
  CHECK_THROWS_WITH_AS(bad.resolve_batch(2),
                       doctest::Contains("train_batch_size 30 != train_micro_batch_size_per_gpu 4"), Error);
  EngineConfig none = parse_config_json("{}");
  CHECK_THROWS_AS(none.resolve_batch(1), Error);
}

TEST_CASE("config files are read, and a missing file names its path") {
  const std::string path = "zest_test_config.json";
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 1}, "bf16": {"enabled": true}})";
  }
  const EngineConfig c = load_config_file(path);
  CHECK(c.zero.stage == 1);
  CHECK(c.bf16);
  {
    std::ofstream out(path);
    out << R"({"zero_optimization": {"stage": 9}})";
  }
  CHECK_THROWS_WITH_AS(load_config_file(path), doctest::Contains("(in zest_test_config.json)"), Error);
  std::remove(path.c_str());
  CHECK_THROWS_WITH_AS(load_config_file("/nonexistent/ds.json"),
                       doctest::Contains("cannot open '/nonexistent/ds.json'"), Error);
}

TEST_CASE("the reduce bucket: a quarter of the model up to 5e8 unless set; at stage 3 within the prefetch window") {
  ZeroConfig z;
  z.stage = 2;
  CHECK(z.reduce_bucket(1) == 1);
  CHECK(z.reduce_bucket(1000) == 250);
  CHECK(z.reduce_bucket(1001) == 251);  // rounded up: four buckets at most
  CHECK(z.reduce_bucket(size_t{4} << 30) == 500'000'000);
  z.stage = 3;  // stage3_prefetch_bucket_size 5e7 by default
  CHECK(z.reduce_bucket(1000) == 250);
  CHECK(z.reduce_bucket(size_t{1} << 30) == 50'000'000);
  z.stage3_prefetch_bucket_size = 0;  // no prefetch: no cap
  CHECK(z.reduce_bucket(size_t{1} << 30) == (int64_t{1} << 28));
  z.reduce_bucket_size = 7;
  CHECK(z.reduce_bucket(1000) == 7);
  z.stage = 2;
  CHECK(z.reduce_bucket(size_t{4} << 30) == 7);
  const EngineConfig c = parse_config_json(R"({"zero_optimization": {"stage": 1}})");
  CHECK_FALSE(c.zero.reduce_bucket_size.has_value());
  CHECK_FALSE(c.zero.overlap());
}
