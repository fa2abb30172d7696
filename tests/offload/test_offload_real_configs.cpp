// The real ZeRO-3 offload files of tests/config/ds_configs (offload_optimizer
// and offload_param, device cpu), loaded unchanged, train on 2 in-process
// ranks with the bits of the same configuration with both offloads off.
#include <doctest/doctest.h>

#include <filesystem>

#include "engine/engine_harness.h"
#include "zest/config/config.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

TEST_CASE("the real ZeRO-3 offload files train, bit for bit as without offload") {
  const fs::path dir = fs::path(ZEST_SOURCE_DIR) / "tests" / "config" / "ds_configs";
  AutoValues program;  // what a Trainer fills "auto" from
  program.micro_batch_size = 4;
  program.gradient_accumulation_steps = 2;
  program.compute_dtype = DType::kBFloat16;
  program.hidden_size = 1024;
  program.learning_rate = 1e-3;
  program.weight_decay = 0.01;
  program.gradient_clipping = 1.0;
  program.warmup_steps = 0;
  program.total_steps = 100;
  int files = 0;
  for (const std::string name : {"accelerate__tests_deepspeed_ds_config_zero3.json",
                           "axolotl__deepspeed_configs_zero3_bf16_cpuoffload_all.json",
                           "llamafactory__examples_deepspeed_ds_z3_offload_config.json",
                           "llava__scripts_zero3_offload.json",
                           "transformers__tests_deepspeed_ds_config_zero3.json"}) {
    CAPTURE(name);
    EngineConfig config = load_config_file((dir / name).string(), program);
    REQUIRE(config.zero.stage == 3);
    REQUIRE(config.offload_optimizer.device == OffloadDevice::kCpu);
    REQUIRE(config.offload_param.device == OffloadDevice::kCpu);
    // The harness's units have at most 256 elements: every file's
    // persistence threshold would keep them all whole, with nothing to
    // offload. Gathered on demand instead, as a large model's are.
    config.zero.stage3_param_persistence_threshold = 0;
    EngineConfig plain = config;
    plain.offload_optimizer.device = OffloadDevice::kNone;
    plain.offload_param.device = OffloadDevice::kNone;
    // Three steps: the files' WarmupLR gives the first two DeepSpeed's
    // warmup_min_lr, 0 (lr_schedule.h).
    const std::vector<RankResult> want = run_engine(plain, runs(2, 3));
    const std::vector<RankResult> got = run_engine(config, runs(2, 3));
    for (int r = 0; r < 2; ++r) {
      CAPTURE(r);
      const RankResult& g = got[static_cast<size_t>(r)];
      CHECK(g.memory[MemoryCategory::kParameters].current == 0);
      CHECK(g.memory.host(MemoryCategory::kParameters).current > 0);
      REQUIRE(g.steps.size() == 3);
      CHECK(g.steps[2].applied);
      CHECK(g.steps[2].lr > 0.0);
      for (const auto& [param, values] : g.params) {
        CAPTURE(param);
        CHECK(same_bits(values, want[static_cast<size_t>(r)].params.at(param)));
      }
    }
    // It trained: the parameters moved from their initial values.
    std::vector<float> initial(got[0].params.at("a.w").size());
    init_values(ParamLayout{"a.w", {7, 13}, 91, 0, 0}, initial);
    CHECK_FALSE(same_bits(initial, got[0].params.at("a.w")));
    ++files;
  }
  CHECK(files == 5);
}
