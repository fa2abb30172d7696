// What a file leaves to the program or to a default, as DeepSpeed does it:
// no optimizer or scheduler section (the program's own), torch_adam's
// weight decay, WarmupLR's warmup_max_lr, a total_num_steps within the
// warmup; and messages that say what was written, of a bounded size.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include "config_test_helpers.h"
#include "zest/config/detail/config_reader.h"
#include "zest/optim/lr_schedule.h"

using namespace zest;

namespace {

std::string filled(const EngineConfig& c, const std::string& key) {
  for (const ConfigNote& n : c.auto_filled)
    if (n.key == key) return n.text;
  return "";
}

std::string warned(const EngineConfig& c, const std::string& key) {
  for (const ConfigNote& n : c.warnings)
    if (n.key == key) return n.text;
  return "";
}

AutoValues constant_schedule() {
  AutoValues p;
  p.scheduler = LrScheduleConfig{};
  return p;
}

}  // namespace

TEST_CASE("no optimizer section: the program's optimizer, or an error naming what to set") {
  const std::string text = R"({"train_batch_size": 8, "scheduler": {"type": "WarmupLR"}})";
  const std::string e = test::error_of(text, AutoValues{});
  CHECK(e.find("optimizer: the file has no optimizer section, so DeepSpeed would step the program's own optimizer: "
               "set AutoValues::optimizer (or AutoValues::learning_rate") != std::string::npos);

  // Hugging Face's Trainer: AdamW from its arguments, weight decay 0 unless given.
  AutoValues hf;
  hf.learning_rate = 3e-4;
  hf.beta1 = 0.9;
  hf.beta2 = 0.95;
  hf.eps = 1e-6;
  EngineConfig c = parse_config_json(text, hf);
  CHECK(c.optimizer.kind == OptimizerKind::kAdamW);
  CHECK(c.optimizer.lr == 3e-4f);
  CHECK(c.optimizer.weight_decay == 0.0f);
  CHECK(c.optimizer.beta2 == 0.95f);
  CHECK(c.optimizer.eps == 1e-6f);
  CHECK(filled(c, "optimizer").find("AdamW lr 0.0003 weight_decay 0 betas [0.9, 0.95]") == 0);
  // WarmupLR without warmup_max_lr warms up to the optimizer's lr.
  CHECK(c.scheduler.warmup_max_lr == double(3e-4f));
  CHECK(filled(c, "scheduler.params.warmup_max_lr").find("DeepSpeed's WarmupLR takes the optimizer's lr") !=
        std::string::npos);

  // An explicit optimizer of the program's.
  AutoValues sgd;
  sgd.optimizer = OptimizerConfig{};
  sgd.optimizer->kind = OptimizerKind::kSgd;
  sgd.optimizer->lr = 0.1f;
  sgd.optimizer->weight_decay = 0.0f;
  c = parse_config_json(text, sgd);
  CHECK(c.optimizer.kind == OptimizerKind::kSgd);
  CHECK(c.optimizer.lr == 0.1f);
  CHECK(filled(c, "optimizer").find("SGD lr 0.1 weight_decay 0 (from AutoValues::optimizer") == 0);
  sgd.optimizer->lr = -1.0f;
  CHECK(test::error_of(text, sgd).find("AutoValues::optimizer: SGD: lr must be") != std::string::npos);
}

TEST_CASE("no scheduler section: the program's schedule, or an error naming what to set") {
  const std::string text = R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}}})";
  CHECK(test::error_of(text, AutoValues{}).find("scheduler: the file has no scheduler section, so DeepSpeed would "
                                                "step the "
                                  "program's own schedule, if any: set AutoValues::scheduler (LrScheduleConfig{} for "
                                  "a constant learning rate)") != std::string::npos);
  EngineConfig c = parse_config_json(text, constant_schedule());
  CHECK(c.scheduler.kind == LrScheduleKind::kConstant);
  CHECK(filled(c, "scheduler") == "constant (from AutoValues::scheduler: the file has no scheduler section)");
  AutoValues cosine;
  cosine.scheduler = LrScheduleConfig{};
  cosine.scheduler->kind = LrScheduleKind::kWarmupCosineLR;
  cosine.scheduler->total_num_steps = 0;
  CHECK(test::error_of(text, cosine).find("AutoValues::scheduler: WarmupCosineLR: total_num_steps must be at least "
                                          "1") != std::string::npos);
}

TEST_CASE("torch_adam takes torch.optim.AdamW's default weight decay, 0.01, where FusedAdam's is 0") {
  const AutoValues p = constant_schedule();
  auto wd = [&](const std::string& params, const std::string& type = "Adam") {
    return parse_config_json(R"({"optimizer": {"type": ")" + type + R"(", "params": )" + params + "}}", p)
        .optimizer.weight_decay;
  };
  CHECK(wd(R"({"lr": 0.001})") == 0.0f);
  CHECK(wd(R"({"lr": 0.001, "torch_adam": true})") == 0.01f);
  CHECK(wd(R"({"lr": 0.001, "torch_adam": true})", "AdamW") == 0.01f);
  CHECK(wd(R"({"lr": 0.001, "torch_adam": true, "weight_decay": 0.1})") == 0.1f);
  // torch.optim.Adam (adam_w_mode false): its default is 0.
  CHECK(wd(R"({"lr": 0.001, "torch_adam": true, "adam_w_mode": false})") == 0.0f);
  // An "auto" the program leaves unfilled takes torch's default too.
  const EngineConfig c = parse_config_json(
      R"({"optimizer": {"type": "AdamW", "params": {"weight_decay": "auto", "torch_adam": true}}})", p);
  CHECK(c.optimizer.weight_decay == 0.01f);
  CHECK(filled(c, "optimizer.params.weight_decay") ==
        "0.01 (the default; set AutoValues::weight_decay to choose it)");
}

TEST_CASE("a total_num_steps within the warmup is a warning, as in DeepSpeed, and the schedule runs") {
  const std::string text = R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 100, "total_num_steps": 50}}})";
  const EngineConfig c = parse_config_json(text, AutoValues{});
  CHECK(c.scheduler.total_num_steps == 50);
  CHECK(warned(c, "scheduler.params.total_num_steps") ==
        "50 is less than warmup_num_steps 100: the schedule warms up past the end of training (DeepSpeed warns and "
        "runs it; so does ZEST)");
  // Equal is no warning in DeepSpeed.
  const EngineConfig eq = parse_config_json(R"({"optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
      "scheduler": {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 50, "total_num_steps": 50}}})",
                                           AutoValues{});
  CHECK(eq.warnings.empty());
  // WarmupDecayLR's warmup_max_lr default stays 0.001, unlike WarmupLR's.
  CHECK(c.scheduler.warmup_max_lr == 0.001);
  // DeepSpeed's schedules take max(2, warmup_num_steps): 0 and -3 warm up
  // over 2 steps, the rates step by step those of a warmup of 2.
  const auto schedule = [](const char* warmup) {
    return parse_config_json(fmt::format(R"({{"optimizer": {{"type": "AdamW", "params": {{"lr": 0.01}}}},
        "scheduler": {{"type": "WarmupLR", "params": {{"warmup_num_steps": {}}}}}}})",
                                         warmup),
                             AutoValues{})
        .scheduler;
  };
  const LrScheduleConfig two = schedule("2");
  for (const char* warmup : {"0", "1", "-3"}) {
    CAPTURE(warmup);
    const LrScheduleConfig s = schedule(warmup);
    for (int64_t step = 0; step < 5; ++step) CHECK(lr_for_step(s, 0.01, step) == lr_for_step(two, 0.01, step));
  }
  CHECK(lr_for_step(two, 0.01, 0) < lr_for_step(two, 0.01, 2));  // a warmup, not a constant
}

TEST_CASE("messages say what was written") {
  const AutoValues p = constant_schedule();
  // 0.99999999999 rounds to 1 in fp32: the message shows the written value.
  CHECK(test::error_of(R"({"optimizer": {"type": "AdamW", "params": {"betas": [0.9, 0.99999999999]}}})", p)
            .find("optimizer.params.betas [1] is 0.99999999999; allowed: 0 to below 1") != std::string::npos);
  // The deprecated cpu_offload is honoured, so it is a warning, not "ignored".
  const EngineConfig c = parse_config_json(R"({"optimizer": {"type": "AdamW"},
      "zero_optimization": {"stage": 2, "cpu_offload": true}})", p);
  CHECK(c.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK(test::ignored_reason(c, "zero_optimization.cpu_offload").empty());
  CHECK(warned(c, "zero_optimization.cpu_offload").find("deprecated: read as offload_optimizer") == 0);
}

TEST_CASE("a key with a control character is shown escaped, not cut at it") {
  const std::string text = R"({"zero_optimization": {"stage\u0000x": 1}})";  // JSON's escape of NUL
  const std::string e = test::error_of(text);
  CAPTURE(e);
  CHECK(e.find("unknown key 'zero_optimization.stage\\u0000x' in zero_optimization") != std::string::npos);
  // The parser's own errors (a key twice, and the key path) escape it too.
  CHECK(test::error_of(R"({"a\u0000b": {"x": 1, "x\u0001": 1e400}})").find("(at a\\u0000b.x\\u0001)") !=
        std::string::npos);
  CHECK(test::error_of(R"({"a\u0000b": 1, "a\u0000b": 2})")
            .find("the key \"a\\u0000b\" appears twice in one object") != std::string::npos);
}

TEST_CASE("100,000 unknown keys make a short error and a short ignored list, quickly") {
  std::string ignored = "{";
  std::string refused = R"({"zero_optimization": {)";
  for (int i = 0; i < 100'000; ++i) {
    ignored += fmt::format("{}\"k{}\": 0", i ? "," : "", i);
    refused += fmt::format("{}\"k{}\": 0", i ? "," : "", i);
  }
  ignored += "}";
  refused += "}}";
  const EngineConfig c = test::parse(ignored);
  REQUIRE(c.ignored.size() == config_detail::FileState::kMaxIgnored + 1);
  CHECK(c.ignored.back().key == "...");
  CHECK(c.ignored.back().text == fmt::format("and {} more keys ignored, not listed",
                                             100'000 - config_detail::FileState::kMaxIgnored));
  const std::string e = test::error_of(refused);
  CHECK(e.starts_with("config: 100000 problems:\n  - unknown key 'zero_optimization.k"));
  CHECK(e.find(fmt::format("\n  - and {} more, not listed", 100'000 - config_detail::FileState::kMaxProblems)) !=
        std::string::npos);
  CHECK(e.size() < 200'000);
}

TEST_CASE("strings in DeepSpeed's pydantic sections are converted as pydantic converts them, elsewhere refused") {
  const AutoValues p = test::own_optimizer();
  const EngineConfig c = parse_config_json(R"({
      "zero_optimization": {"stage": "3", "overlap_comm": "no", "contiguous_gradients": 0,
                            "reduce_bucket_size": " 5000000 ",
                            "offload_optimizer": {"device": "cpu", "pin_memory": "True", "ratio": "0.5"}},
      "bf16": {"enabled": "yes"}})",
                                           p);
  CHECK(c.zero.stage == 3);
  CHECK(c.zero.overlap_comm == false);
  CHECK(c.zero.contiguous_gradients == false);
  CHECK(c.zero.reduce_bucket_size == 5'000'000);
  CHECK(c.offload_optimizer.pin_memory);
  CHECK(c.offload_optimizer.ratio == 0.5);
  CHECK(c.bf16);
  const EngineConfig f = parse_config_json(R"({"fp16": {"enabled": "on", "loss_scale": "128", "hysteresis": "4"}})", p);
  CHECK(f.fp16.enabled);
  CHECK(f.fp16.loss_scale == 128.0);
  CHECK(f.fp16.hysteresis == 4);
  // What pydantic refuses stays refused, with the value as written.
  CHECK(test::error_of(R"({"zero_optimization": {"stage": "three"}})") ==
        "config: zero_optimization.stage must be a whole number, got \"three\"");
  CHECK(test::error_of(R"({"fp16": {"enabled": "maybe"}})") ==
        "config: fp16.enabled must be true or false, got \"maybe\"");
  CHECK(test::error_of(R"({"fp16": {"min_loss_scale": "0x1p3"}})") ==
        "config: fp16.min_loss_scale must be a number, got \"0x1p3\"");
  CHECK(test::error_of(R"({"zero_optimization": {"overlap_comm": 2}})") ==
        "config: zero_optimization.overlap_comm must be true or false, got 2");
  // DeepSpeed reads the top level and optimizer params with dict lookups:
  // a string there reaches its arithmetic (or torch's) and fails.
  CHECK(test::error_of(R"({"train_batch_size": "8"})") == "config: train_batch_size must be a whole number, got \"8\"");
  CHECK(test::error_of(R"({"optimizer": {"type": "AdamW", "params": {"lr": "1e-3"}}})") ==
        "config: optimizer.params.lr must be a number, got \"1e-3\"");
}

TEST_CASE("a key fp16's or bf16's pydantic model lacks is ignored, saying so, and a typo refused") {
  const EngineConfig c = test::parse(R"({"fp16": {"enabled": true, "fp16_opt_level": "O2"}})");
  CHECK(test::ignored_reason(c, "fp16.fp16_opt_level") ==
        "not a key of DeepSpeed's current model for this section (which refuses it; older DeepSpeed ignored it): ZEST "
        "ignores it");
  CHECK(test::error_of(R"({"bf16": {"enabled": true, "check_grad_overflw": true}})")
            .starts_with("config: unknown key 'bf16.check_grad_overflw' in bf16 (did you mean "
                         "'check_grad_overflow'?)"));
}
