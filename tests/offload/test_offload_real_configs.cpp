// The real ZeRO-3 offload files of tests/config/ds_configs (offload_optimizer
// and offload_param, device cpu), loaded unchanged, train on 2 in-process
// ranks with the bits of the same configuration with both offloads off.
#include <doctest/doctest.h>

#include "config/config_test_helpers.h"
#include "engine/engine_harness.h"
#include "zest/config/config.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("the real ZeRO-3 offload files train, bit for bit as without offload") {
  int files = 0;
  for (const std::string name : {"accelerate__tests_deepspeed_ds_config_zero3.json",
                                   "axolotl__deepspeed_configs_zero3_bf16_cpuoffload_all.json",
                                   "llamafactory__examples_deepspeed_ds_z3_offload_config.json",
                                   "llava__scripts_zero3_offload.json",
                                   "transformers__tests_deepspeed_ds_config_zero3.json"}) {
    CAPTURE(name);
    EngineConfig config = load_config_file(ds_config_path(name).string(), ds_config_program());
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
