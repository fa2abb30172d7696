// DeepSpeed's "Lamb" optimizer type (FusedLamb): its keyword arguments and
// defaults, the values it refuses, and a real LAMB file's optimizer.
#include <doctest/doctest.h>

#include <string>

#include "config/config_test_helpers.h"
#include "zest/config/config.h"
#include "zest/core/check.h"

using namespace zest;
using zest::test::error_of;

TEST_CASE("Lamb: FusedLamb's keyword arguments are read into the optimizer") {
  const EngineConfig c = zest::test::parse(R"({"optimizer": {"type": "Lamb", "params": {
      "lr": 0.002, "betas": [0.8, 0.99], "eps": 1e-6, "weight_decay": 0.05, "bias_correction": false,
      "max_coeff": 0.3, "min_coeff": 0.02, "eps_inside_sqrt": true, "amsgrad": false, "max_grad_norm": 0}}})");
  const OptimizerConfig& o = c.optimizer;
  CHECK(o.kind == OptimizerKind::kLamb);
  CHECK(optimizer_name(o.kind) == "Lamb");
  CHECK(o.lr == 0.002f);
  CHECK(o.beta1 == 0.8f);
  CHECK(o.beta2 == 0.99f);
  CHECK(o.eps == 1e-6f);
  CHECK(o.weight_decay == 0.05f);
  CHECK_FALSE(o.bias_correction);
  CHECK(o.max_coeff == 0.3f);
  CHECK(o.min_coeff == 0.02f);
  CHECK(o.eps_inside_sqrt);
  CHECK(o.state_buffers() == 2);  // m and v, like Adam's
}

TEST_CASE("Lamb: FusedLamb's defaults, and the type's spelling in any case") {
  const OptimizerConfig o = zest::test::parse(R"({"optimizer": {"type": "lamb"}})").optimizer;
  CHECK(o.kind == OptimizerKind::kLamb);
  CHECK(o.lr == 1e-3f);
  CHECK(o.weight_decay == 0.0f);
  CHECK(o.beta1 == 0.9f);
  CHECK(o.beta2 == 0.999f);
  CHECK(o.eps == 1e-8f);
  CHECK(o.bias_correction);
  CHECK(o.max_coeff == 10.0f);
  CHECK(o.min_coeff == 0.01f);
  CHECK_FALSE(o.eps_inside_sqrt);
}

TEST_CASE("Lamb: values FusedLamb cannot use are refused, naming the key") {
  CHECK(error_of(R"({"optimizer": {"type": "Lamb", "params": {"min_coeff": 0.5, "max_coeff": 0.1}}})") ==
        "config: optimizer: Lamb: max_coeff must be a finite number >= min_coeff (0.5), got 0.1 (DeepSpeed's "
        "default is 10)");
  CHECK(error_of(R"({"optimizer": {"type": "Lamb", "params": {"min_coeff": 0}}})")
            .find("optimizer.params.min_coeff is 0") != std::string::npos);
  CHECK(error_of(R"({"optimizer": {"type": "Lamb", "params": {"max_grad_norm": 1.0}}})")
            .find("FusedLamb's own clipping (max_grad_norm") != std::string::npos);
  CHECK(error_of(R"({"optimizer": {"type": "Lamb"}, "fp16": {"enabled": true, "loss_scale": 128}})") ==
        "config: optimizer Lamb with the static fp16.loss_scale 128: DeepSpeed requires dynamic loss scaling with "
        "Lamb; set fp16.loss_scale to 0");
  // Keywords of torch's optimizers are not FusedLamb's: unknown there.
  CHECK(error_of(R"({"optimizer": {"type": "Lamb", "params": {"foreach": true}}})")
            .starts_with("config: unknown key 'optimizer.params.foreach'"));
  CHECK(error_of(R"({"optimizer": {"type": "Lamb", "params": {"adam_w_mode": true}}})")
            .starts_with("config: unknown key 'optimizer.params.adam_w_mode'"));
}

TEST_CASE("Lamb: DeepSpeedExamples' BERT LAMB file loads, without its sparse attention") {
  // training/bing_bert/deepspeed_bsz64k_lamb_config_seq128.json (tests/
  // config/ds_configs), less the sparse_attention section ZEST lacks.
  const EngineConfig c = zest::test::parse(R"({
  "train_batch_size": 65536,
  "train_micro_batch_size_per_gpu": 64,
  "steps_per_print": 1000,
  "prescale_gradients": false,
  "optimizer": {
    "type": "Lamb",
    "params": {
      "lr": 11e-3,
      "weight_decay": 0.01,
      "bias_correction": false,
      "max_coeff": 0.3,
      "min_coeff": 0.01
    }
  },
  "gradient_clipping": 1.0,
  "wall_clock_breakdown": false,
  "fp16": {
    "enabled": true,
    "loss_scale": 0
  }
})");
  CHECK(c.optimizer.kind == OptimizerKind::kLamb);
  CHECK(c.optimizer.lr == 11e-3f);
  CHECK(c.optimizer.weight_decay == 0.01f);
  CHECK_FALSE(c.optimizer.bias_correction);
  CHECK(c.optimizer.max_coeff == 0.3f);
  CHECK(c.optimizer.min_coeff == 0.01f);
  CHECK(c.gradient_clipping == 1.0);
  CHECK(c.fp16.enabled);
  EngineConfig batch = c;
  batch.resolve_batch(64);
  CHECK(batch.gradient_accumulation_steps == 16);
}

#ifdef ZEST_SOURCE_DIR
TEST_CASE("Lamb: the real BERT LAMB file is refused for its sparse attention only") {
  std::string error;
  try {
    (void)load_config_file(
        zest::test::ds_config_path("dsexamples__training_bing_bert_deepspeed_bsz64k_lamb_config_seq128.json").string(),
        zest::test::ds_config_program());
  } catch (const Error& e) {
    error = e.message();
  }
  CHECK(error.find("DeepSpeed's sparse attention") != std::string::npos);
  CHECK(error.find("optimizer") == std::string::npos);
}
#endif
