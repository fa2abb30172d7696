// "auto": filled from the program's AutoValues after Hugging Face's rules
// (transformers' HfTrainerDeepSpeedConfig), or the key's default, noted.
#include <doctest/doctest.h>

#include "config_test_helpers.h"
#include "zest/config/config.h"
#include "zest/core/check.h"

namespace test_config_auto {

using namespace zest;

namespace {

// A Hugging Face file: every value the Trainer knows is "auto".
constexpr const char* kHfZero3 = R"({
  "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                     "warmup_num_steps": "auto", "total_num_steps": "auto"}},
  "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto",
                        "stage3_param_persistence_threshold": "auto"},
  "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
  "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto"})";

AutoValues full_program() {
  AutoValues p;
  p.micro_batch_size = 4;
  p.gradient_accumulation_steps = 3;
  p.world_size = 2;
  p.compute_dtype = DType::kBFloat16;
  p.hidden_size = 3584;
  p.learning_rate = 2e-5;
  p.weight_decay = 0.1;
  p.beta1 = 0.9;
  p.beta2 = 0.95;
  p.eps = 1e-6;
  p.gradient_clipping = 1.0;
  p.warmup_steps = 100;
  p.total_steps = 5000;
  return p;
}

std::string note(const std::vector<ConfigNote>& notes, const std::string& key) {
  for (const ConfigNote& n : notes)
    if (n.key == key) return n.text;
  return "(none)";
}

std::string error_of(const std::string& text, const AutoValues& program) {
  try {
    (void)parse_config_json(text, program);
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

}  // namespace

TEST_CASE("\"auto\" takes the program's values by Hugging Face's rules") {
  const EngineConfig c = parse_config_json(kHfZero3, full_program());
  CHECK(c.train_micro_batch_size_per_gpu == 4);
  CHECK(c.gradient_accumulation_steps == 3);
  CHECK(c.train_batch_size == 24);  // world 2 x micro 4 x accumulation 3
  CHECK(c.bf16);
  CHECK_FALSE(c.fp16.enabled);
  // As LLaMA-Factory's ds_z3_fp8_config.json has them for hidden size 3584.
  CHECK(c.zero.reduce_bucket_size == 12845056);
  CHECK(c.zero.stage3_prefetch_bucket_size == 11560550);  // int(0.9 * 3584 * 3584)
  CHECK(c.zero.stage3_param_persistence_threshold == 35840);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.optimizer.kind == OptimizerKind::kAdamW);
  CHECK(c.optimizer.lr == 2e-5f);
  CHECK(c.optimizer.weight_decay == 0.1f);
  CHECK(c.optimizer.beta1 == 0.9f);
  CHECK(c.optimizer.beta2 == 0.95f);
  CHECK(c.optimizer.eps == 1e-6f);
  CHECK(c.scheduler.warmup_min_lr == 0.0);
  CHECK(c.scheduler.warmup_max_lr == 2e-5);
  CHECK(c.scheduler.warmup_num_steps == 100);
  CHECK(c.scheduler.total_num_steps == 5000);
  CHECK(c.mismatched.empty());
  CHECK(note(c.auto_filled, "zero_optimization.stage3_prefetch_bucket_size") ==
        "11560550 (from AutoValues::hidden_size, int(0.9 x hidden_size^2))");
  CHECK(note(c.auto_filled, "train_batch_size") ==
        "24 (from AutoValues::world_size, world_size x micro x accumulation)");
  CHECK(c.auto_filled.size() == 17);
}

TEST_CASE("\"auto\" the program leaves unfilled takes the default, noted, one without a default is an error") {
  AutoValues p;
  p.micro_batch_size = 2;
  p.total_steps = 2000;
  const EngineConfig c = parse_config_json(kHfZero3, p);
  CHECK(c.train_micro_batch_size_per_gpu == 2);
  CHECK_FALSE(c.gradient_accumulation_steps.has_value());  // derived by resolve_batch: 1 with micro alone
  CHECK_FALSE(c.train_batch_size.has_value());             // derived at the Engine's real world size
  CHECK_FALSE(c.fp16.enabled);
  CHECK_FALSE(c.bf16);
  CHECK_FALSE(c.zero.reduce_bucket_size.has_value());      // ZeroConfig::reduce_bucket's rule
  CHECK(c.zero.stage3_prefetch_bucket_size == 50'000'000);  // DeepSpeed's defaults
  CHECK(c.zero.stage3_param_persistence_threshold == 100'000);
  CHECK(c.optimizer.lr == 1e-3f);  // FusedAdam's
  CHECK(c.optimizer.weight_decay == 0.0f);
  CHECK(c.scheduler.warmup_max_lr == 0.001);
  CHECK(c.scheduler.warmup_num_steps == 1000);
  CHECK(c.scheduler.total_num_steps == 2000);
  CHECK(note(c.auto_filled, "bf16.enabled") == "false (the default; set AutoValues::compute_dtype to choose it)");
  CHECK(note(c.auto_filled, "optimizer.params.betas") ==
        "[0.9, 0.999] (the default; set AutoValues::beta1 and beta2 to choose them)");
  CHECK(note(c.auto_filled, "train_batch_size") == "not set (the default; set AutoValues::world_size to choose it)");

  AutoValues none;
  CHECK(error_of(kHfZero3, none) ==
        "config: 2 problems:\n"
        "  - train_batch_size and train_micro_batch_size_per_gpu: \"auto\" left both unset, and DeepSpeed needs one "
        "of them: set AutoValues::micro_batch_size (or write a value)\n"
        "  - scheduler.params.total_num_steps is \"auto\" and has no default: set AutoValues::total_steps (or "
        "write a value)");
}

TEST_CASE("hidden-size keys at stages below 3 and values written in the file") {
  AutoValues p = full_program();
  p.scheduler = LrScheduleConfig{};
  const EngineConfig z2 = parse_config_json(R"({"train_micro_batch_size_per_gpu": 4,
      "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}})",
                                            p);
  CHECK(z2.zero.reduce_bucket_size == 3584 * 3584);
  CHECK(z2.zero.stage3_prefetch_bucket_size == 50'000'000);  // Hugging Face fills it at stage 3 only
  // A written value wins over the program's; the difference is noted.
  const EngineConfig w = parse_config_json(R"({"train_micro_batch_size_per_gpu": 8,
      "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.999]}}})",
                                           p);
  CHECK(w.train_micro_batch_size_per_gpu == 8);
  CHECK(w.optimizer.lr == 3e-4f);
  CHECK(note(w.mismatched, "train_micro_batch_size_per_gpu") ==
        "8 in the file, 4 from AutoValues::micro_batch_size: the file's value is used (write \"auto\" to take the "
        "program's)");
  CHECK(note(w.mismatched, "optimizer.params.lr") ==
        "0.0003 in the file, 2e-05 from AutoValues::learning_rate: the file's value is used (write \"auto\" to take "
        "the program's)");
  CHECK(w.mismatched.size() == 3);  // micro, lr, betas
  // A program value out of range for the key is named.
  AutoValues big = test::own_optimizer();
  big.hidden_size = int64_t{1} << 30;
  CHECK(error_of(R"({"zero_optimization": {"reduce_bucket_size": "auto"}})", big) ==
        "config: AutoValues::hidden_size is 1073741824; allowed: 1 to 2^25");
}

TEST_CASE("the header's example") {
  zest::AutoValues program;  // what "auto" entries take
  program.micro_batch_size = 8;
  program.compute_dtype = zest::DType::kBFloat16;
  program.hidden_size = 4096;
  program.learning_rate = 2e-5;
  program.scheduler = zest::LrScheduleConfig{};  // a constant rate: the file has no scheduler
  zest::EngineConfig cfg = zest::parse_config_json(R"({
      "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
      "bf16": {"enabled": "auto"}, "memory_breakdown": false,
      "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})", program);
  CHECK(cfg.bf16);
  CHECK(cfg.zero.reduce_bucket_size == 4096 * 4096);
  REQUIRE(cfg.ignored.size() == 1);
  CHECK(cfg.ignored[0].key == "memory_breakdown");
}

}  // namespace test_config_auto
