// Frozen units with offload_optimizer (a fine-tuning whose trainable part is
// offloaded): the host part covers the trainable units' shards only, indexed
// past a frozen unit in the middle of the model, and a run gives the bits of
// the same run without offload; memory equals the estimate, device and host.
#include <doctest/doctest.h>

#include "checkpoint/temp_dir.h"
#include "engine/engine_harness.h"
#include "offload/memory_as_estimated.h"
#include "zest/estimate/memory_estimate.h"

using namespace zest;
using namespace zest::test;

namespace {

// Units a, f (frozen), b, c: the frozen unit between trainable ones.
void register_model_with_frozen(Engine& engine) {
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}});
  engine.add_unit("f", {{"f.w", {5, 7}, "default", false}, {"f.b", {5}, "no_decay", false}});
  engine.add_unit("b", {{"b.w", {5, 7}}, {"b.b", {5}, "no_decay"}, {"b.s", {}, "no_decay"}});
  engine.add_unit("c", {{"c.w", {11, 3}}});
}

ModelDescription model_with_frozen() {
  ModelDescription m;
  m.units = {{"a", {91, 7}, 1}, {"f", {35, 5}, 1, true}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}};
  return m;
}

// `steps` optimizer steps on `world` ranks, "f" gathered but given no
// gradient; every rank's master values, steps and memory.
std::vector<RankResult> run_with_frozen(const EngineConfig& config, int world, int steps) {
  std::vector<RankResult> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine = finalized_engine(config, comm, alloc, host,
                                                            Stream::default_for(Device::host()),
                                                            register_model_with_frozen);
    RankResult r;
    const int units = engine->layout().num_units();
    for (int64_t s = 0; s < steps; ++s) {
      for (int m = 0; m < static_cast<int>(engine->config().accumulation_steps()); ++m) {
        for (int u = 0; u < units; ++u) UnitHandle h = engine->gather(u);
        for (int u = units - 1; u >= 0; --u) {
          if (engine->layout().unit(u).frozen) {
            UnitHandle h = engine->gather(u);  // used by backward, no gradient
            continue;
          }
          if (engine->compute_dtype() == DType::kFloat32) {
            write_grads<float>(*engine, u, comm.rank(), s, m, Backward{});
          } else {
            write_grads<bf16>(*engine, u, comm.rank(), s, m, Backward{});
          }
        }
        const StepResult step = engine->step();
        if (step.boundary) r.steps.push_back(step);
      }
    }
    r.params = master_params(*engine);
    r.memory = engine->memory_report();
    out[static_cast<size_t>(comm.rank())] = r;
  });
  return out;
}

}  // namespace

TEST_CASE("frozen units with offload_optimizer: the bits of the device run, stages 1-3, 1, 2 and 4 ranks") {
  struct Case {
    double ratio;
    bool delayed;
  };
  for (const bool bf16_compute : {false, true}) {
    for (int world : {1, 2, 4}) {
      for (int stage : {1, 2, 3}) {
        CAPTURE(bf16_compute);
        CAPTURE(world);
        CAPTURE(stage);
        EngineConfig config = base_config(stage);
        config.bf16 = bf16_compute;
        config.gradient_clipping = 0.05;  // the norm leaves the frozen unit out
        config.gradient_accumulation_steps = 2;
        const std::vector<RankResult> want = run_with_frozen(config, world, 3);
        for (const Case k : {Case{1.0, false}, Case{0.5, false}}) {
          CAPTURE(k.ratio);
          EngineConfig off = config;
          off.offload_optimizer.device = OffloadDevice::kCpu;
          off.offload_optimizer.ratio = k.ratio;
          const std::vector<RankResult> got = run_with_frozen(off, world, 3);
          for (int r = 0; r < world; ++r) {
            CAPTURE(r);
            const RankResult& g = got[static_cast<size_t>(r)];
            for (const auto& [name, values] : want[static_cast<size_t>(r)].params) {
              CAPTURE(name);
              CHECK(same_bits(g.params.at(name), values));
            }
            REQUIRE(g.steps.size() == 3);
            CHECK(g.steps[2].grad_norm == want[static_cast<size_t>(r)].steps[2].grad_norm);
            // The frozen unit keeps its parameters on the device and has no
            // state anywhere: the host holds the trainable part only.
            CHECK(g.memory.frozen_parameters == want[static_cast<size_t>(r)].memory.frozen_parameters);
          }
          // Device and host bytes, category by category, as estimated.
          const MemoryEstimate e = estimate_memory(model_with_frozen(), EstimateOptions::from_config(off, world));
          for (const RankResult& g : got) check_memory_as_estimated(g.memory, e);
        }
      }
    }
  }
}

TEST_CASE("frozen units with offload_param at stage 3: the frozen shards live on the host too") {
  EngineConfig config = base_config(3);
  config.bf16 = true;
  const std::vector<RankResult> want = run_with_frozen(config, 2, 3);
  config.offload_optimizer.device = OffloadDevice::kCpu;
  config.offload_param.device = OffloadDevice::kCpu;
  const std::vector<RankResult> got = run_with_frozen(config, 2, 3);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    for (const auto& [name, values] : want[static_cast<size_t>(r)].params) {
      CAPTURE(name);
      CHECK(same_bits(got[static_cast<size_t>(r)].params.at(name), values));
    }
    CHECK(got[static_cast<size_t>(r)].memory[MemoryCategory::kParameters].current == 0);
  }
}

TEST_CASE("frozen units with offload_param nvme: the frozen shard on NVMe, max_in_cpu holding the trainable ones") {
  // DeepSpeed's max_in_cpu counts the optimizer's parameter groups only: a
  // frozen unit stays on NVMe however large max_in_cpu is.
  EngineConfig config = base_config(3);
  config.bf16 = true;
  const std::vector<RankResult> want = run_with_frozen(config, 2, 3);
  TempDir dir;
  config.offload_optimizer.device = OffloadDevice::kNvme;
  config.offload_optimizer.nvme_path = dir.str();
  config.offload_param.device = OffloadDevice::kNvme;
  config.offload_param.nvme_path = dir.str();
  const std::vector<RankResult> got = run_with_frozen(config, 2, 3);
  const MemoryEstimate e = estimate_memory(model_with_frozen(), EstimateOptions::from_config(config, 2));
  // The frozen unit's shard (256 elements, bf16: 512 bytes), two 4096-byte
  // slots; the trainable shards in host memory.
  CHECK(e.nvme(MemoryCategory::kParameters).persistent == 2 * 4096);
  for (int r = 0; r < 2; ++r) {
    CAPTURE(r);
    const RankResult& g = got[static_cast<size_t>(r)];
    for (const auto& [name, values] : want[static_cast<size_t>(r)].params) {
      CAPTURE(name);
      CHECK(same_bits(g.params.at(name), values));
    }
    CHECK(g.memory[MemoryCategory::kParameters].current == 0);
    CHECK(g.memory.host(MemoryCategory::kParameters).current == 3 * 256 * 2);
    check_memory_as_estimated(g.memory, e);
  }
}
