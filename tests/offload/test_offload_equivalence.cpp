// offload_optimizer: runs whose master weights and optimizer state live in
// the host allocator give the bits of runs that keep them on the device, at
// stages 1-3 on 1, 2 and 4 in-process ranks, with all of the state offloaded
// and with part of it (ratio < 1, split inside a unit); at stage 3 with the
// parameter shards offloaded too (offload_param); the state is in the host
// allocator's report; bad offload settings are clear errors.
#include <doctest/doctest.h>

#include "engine/engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {

EngineConfig offloaded(EngineConfig c, double ratio = 1.0) {
  c.offload_optimizer.device = OffloadDevice::kCpu;
  c.offload_optimizer.ratio = ratio;
  return c;
}

EngineConfig params_offloaded(EngineConfig c) {
  c = offloaded(c);
  c.offload_param.device = OffloadDevice::kCpu;
  return c;
}

// Every rank's parameters and every step's results, bit for bit.
void check_same_run(const std::vector<RankResult>& got, const std::vector<RankResult>& reference) {
  REQUIRE(got.size() == reference.size());
  for (size_t r = 0; r < got.size(); ++r) {
    CAPTURE(r);
    const RankResult& g = got[r];
    const RankResult& want = reference[r];
    REQUIRE(g.params.size() == want.params.size());
    for (const auto& [name, values] : g.params) {
      CAPTURE(name);
      CHECK(same_bits(values, want.params.at(name)));
    }
    REQUIRE(g.steps.size() == want.steps.size());
    for (size_t s = 0; s < g.steps.size(); ++s) {
      CHECK(g.steps[s].grad_norm == want.steps[s].grad_norm);
      CHECK(g.steps[s].applied == want.steps[s].applied);
      CHECK(g.steps[s].loss_scale == want.steps[s].loss_scale);
    }
  }
}

// Runs `config` at stages 1-3 on `world` ranks with and without offload and
// checks every rank's parameters and every step's results bit for bit.
void check_offload_equivalence(EngineConfig config, int world, RunOptions opt = runs(1, 4)) {
  CAPTURE(world);
  opt.world = world;
  for (int stage : {1, 2, 3}) {
    CAPTURE(stage);
    config.zero.stage = stage;
    const std::vector<RankResult> reference = run_engine(config, opt);
    // The run moved the parameters: equality of runs that did nothing would pass too.
    std::vector<float> initial(reference[0].params.at("a.w").size());
    init_values(ParamLayout{"a.w", {7, 13}, 91, 0, 0}, initial);
    CHECK_FALSE(same_bits(initial, reference[0].params.at("a.w")));
    for (double ratio : {1.0, 0.5}) {
      CAPTURE(ratio);
      check_same_run(run_engine(offloaded(config, ratio), opt), reference);
    }
    if (stage == 3) {
      INFO("offload_param");
      check_same_run(run_engine(params_offloaded(config), opt), reference);
    }
  }
}

}  // namespace

TEST_CASE("offloaded fp32 AdamW equals the device run bit for bit: stages 1-3, 1, 2 and 4 ranks") {
  EngineConfig config = base_config(1);
  config.gradient_accumulation_steps = 2;
  config.gradient_clipping = 0.5;
  for (int world : {1, 2, 4}) check_offload_equivalence(config, world);
}

TEST_CASE("offloaded bf16 AdamW on two host threads equals the device run bit for bit") {
  EngineConfig config = base_config(1);
  config.bf16 = true;
  config.optimizer.host_threads = 2;
  config.gradient_clipping = 1.0;
  for (int world : {1, 2, 4}) check_offload_equivalence(config, world);
}

TEST_CASE("offloaded fp16 Adam with a skipped overflow step, and SGD with and without momentum") {
  EngineConfig config = base_config(1);
  config.optimizer.kind = OptimizerKind::kAdam;
  config.fp16.enabled = true;
  config.fp16.initial_scale_power = 8;
  RunOptions opt = runs(1, 4);
  opt.backward.poison = [](int64_t step, int) { return step == 1; };
  check_offload_equivalence(config, 2, opt);

  config = base_config(1);
  config.optimizer.kind = OptimizerKind::kSgd;
  config.optimizer.momentum = 0.9f;
  config.optimizer.nesterov = true;
  check_offload_equivalence(config, 2);
  config.optimizer.momentum = 0.0f;  // no state buffers at all
  config.optimizer.nesterov = false;
  check_offload_equivalence(config, 4);
}

TEST_CASE("memory_report: the offloaded master weights and optimizer state are in the host allocator") {
  EngineConfig config = base_config(1);
  config.bf16 = true;
  // One rank: the owned region is the whole model, 3 units of 256 elements.
  const size_t owned = 768;
  const RankResult plain = run_engine(config, runs(1, 1))[0];
  CHECK(plain.memory[MemoryCategory::kMasterWeights].current == static_cast<int64_t>(owned * 4));
  CHECK(plain.memory[MemoryCategory::kOptimizerState].current == static_cast<int64_t>(2 * owned * 4));
  CHECK(plain.memory.host_model_states() == 0);

  const RankResult all = run_engine(offloaded(config), runs(1, 1))[0];
  CHECK(all.memory[MemoryCategory::kMasterWeights].current == 0);
  CHECK(all.memory[MemoryCategory::kOptimizerState].current == 0);
  CHECK(all.memory.host(MemoryCategory::kMasterWeights).current == static_cast<int64_t>(owned * 4));
  CHECK(all.memory.host(MemoryCategory::kOptimizerState).current == static_cast<int64_t>(2 * owned * 4));
  // The device keeps the parameters and gradients as before.
  CHECK(all.memory[MemoryCategory::kParameters].current == plain.memory[MemoryCategory::kParameters].current);
  CHECK(all.memory[MemoryCategory::kGradients].current == plain.memory[MemoryCategory::kGradients].current);
  CHECK(all.memory.model_states() == plain.memory.model_states() - static_cast<int64_t>(3 * owned * 4));
  // Two staging slots of gradients and of parameters, one chunk each: 768 /
  // 16 rounded up to 64 elements of bf16.
  CHECK(all.memory.host(MemoryCategory::kCommBuffers).current == 4 * 64 * 2);
  CHECK(all.memory.host_reserved >= all.memory.host_allocated);

  // ratio 0.4: 307 elements, down to a multiple of 64, on the host.
  const RankResult part = run_engine(offloaded(config, 0.4), runs(1, 1))[0];
  CHECK(part.memory.host(MemoryCategory::kMasterWeights).current == 256 * 4);
  CHECK(part.memory[MemoryCategory::kMasterWeights].current == static_cast<int64_t>((owned - 256) * 4));
  CHECK(part.memory.host(MemoryCategory::kOptimizerState).current == 2 * 256 * 4);
  CHECK(part.memory[MemoryCategory::kOptimizerState].current == static_cast<int64_t>(2 * (owned - 256) * 4));
}

TEST_CASE("memory_report: offload_param keeps the parameter shards in the host allocator") {
  // One rank, stage 3, every unit gathered on demand (threshold 0): the
  // rank's shards are the whole model, 3 units of 256 elements.
  EngineConfig config = base_config(3);
  config.bf16 = true;
  const size_t owned = 768;
  const RankResult opt_only = run_engine(offloaded(config), runs(1, 1))[0];
  const RankResult both = run_engine(params_offloaded(config), runs(1, 1))[0];
  CHECK(opt_only.memory[MemoryCategory::kParameters].current == static_cast<int64_t>(owned * 2));
  CHECK(opt_only.memory.host(MemoryCategory::kParameters).current == 0);
  // Between steps nothing is gathered: no parameter bytes on the device.
  CHECK(both.memory[MemoryCategory::kParameters].current == 0);
  CHECK(both.memory.host(MemoryCategory::kParameters).current == static_cast<int64_t>(owned * 2));
  // Without offload_param one rank keeps the units resident (Note [one
  // partition keeps stage 3 resident]): its shards are the full parameters,
  // never gathered into a second buffer. With it, a gathered unit's full
  // buffer is all the device holds: the shard is copied into its slot of
  // one, and the units are gathered one at a time.
  CHECK(opt_only.memory[MemoryCategory::kParameters].peak == static_cast<int64_t>(owned * 2));
  CHECK(both.memory[MemoryCategory::kParameters].peak == static_cast<int64_t>(owned / 3 * 2));
  CHECK(both.memory.host_model_states() == opt_only.memory.host_model_states() + static_cast<int64_t>(owned * 2));
  CHECK(both.memory[MemoryCategory::kGradients].current == opt_only.memory[MemoryCategory::kGradients].current);
}

TEST_CASE("offload_param device nvme runs with offload_optimizer nvme only, and without it the engine says so by name") {
  // It runs (test_offload_nvme_param.cpp) where the master weights are on
  // the drive too, whose previous values undo a step that failed to write
  // the parameters.
  CachingAllocator alloc(make_host_allocator());
  const Stream stream = Stream::default_for(Device::host());
  EngineConfig config = base_config(3);
  config.offload_param.device = OffloadDevice::kNvme;
  const auto construct = [&] {
    run_inprocess(1, [&](Communicator& comm) { Engine engine(config, comm, alloc, stream); });
  };
  for (const OffloadDevice optimizer : {OffloadDevice::kNone, OffloadDevice::kCpu}) {
    config.offload_optimizer.device = optimizer;
    CHECK_THROWS_WITH_AS(construct(),
                         doctest::Contains(fmt::format("zero_optimization.offload_param (device nvme) needs "
                                                       "offload_optimizer {{\"device\": \"nvme\"}} with ratio 1 in "
                                                       "ZEST: its host optimizer writes the parameters, and a step that "
                                                       "fails to write them to the drive is undone with the master "
                                                       "weights' previous values, which only the optimizer's swap file "
                                                       "keeps; this config has offload_optimizer device {}, ratio 1",
                                                       optimizer == OffloadDevice::kCpu ? "cpu" : "none")
                                               .c_str()),
                         Error);
  }
}

TEST_CASE("offload settings the engine cannot honour are errors naming the key") {
  CachingAllocator alloc(make_host_allocator());
  const Stream stream = Stream::default_for(Device::host());
  const auto construct = [&](const EngineConfig& config) {
    run_inprocess(1, [&](Communicator& comm) { Engine engine(config, comm, alloc, stream); });
  };
  EngineConfig config = offloaded(base_config(0));
  CHECK_THROWS_WITH_AS(construct(config),
                       doctest::Contains("offload_optimizer (device cpu) needs ZeRO stage 1, 2 or 3; this config is stage 0"),
                       Error);
  config = offloaded(base_config(2), 1.5);
  CHECK_THROWS_WITH_AS(construct(config), doctest::Contains("offload_optimizer.ratio is 1.5: it must be in [0, 1]"),
                       Error);
  // offload_param runs with the whole optimizer on the host (its update
  // writes the offloaded parameters).
  config = base_config(3);
  config.offload_param.device = OffloadDevice::kCpu;
  CHECK_THROWS_WITH_AS(construct(config),
                       doctest::Contains("zero_optimization.offload_param (device cpu) needs offload_optimizer "
                                         "{\"device\": \"cpu\"} (or \"nvme\") with ratio 1 in ZEST, whose host optimizer then "
                                         "writes the offloaded parameters; this config has offload_optimizer device "
                                         "none, ratio 1"),
                       Error);
  config = params_offloaded(base_config(3));
  config.offload_optimizer.ratio = 0.5;
  CHECK_THROWS_WITH_AS(construct(config), doctest::Contains("offload_optimizer device cpu, ratio 0.5"), Error);
  config.offload_optimizer.ratio = 1.0;
  CHECK_NOTHROW(construct(config));
  // Below stage 3 DeepSpeed ignores offload_param, and so does ZEST.
  config = base_config(2);
  config.offload_param.device = OffloadDevice::kCpu;
  CHECK_NOTHROW(construct(config));
}

TEST_CASE("an engine whose host allocator was destroyed says so instead of touching freed memory") {
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    auto host = std::make_unique<CachingAllocator>(make_host_allocator());
    Engine engine(offloaded(base_config(1)), comm, alloc, *host, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    host.reset();  // a caller's bug: the engine borrows it
    const char* what = "the host CachingAllocator this Engine was created with has been destroyed";
    CHECK_THROWS_WITH_AS(engine.memory_report(), doctest::Contains(what), Error);
    CHECK_THROWS_WITH_AS(engine.step(), doctest::Contains(what), Error);
  });
}
