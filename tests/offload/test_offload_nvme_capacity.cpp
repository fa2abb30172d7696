// A model whose model states are several times the host's memory trains
// with offload_optimizer device nvme, where with device cpu the engine runs
// out of host memory: on the host backend, the host a capacity-limited
// allocator (RunOptions::host_capacity, make_limited_allocator), as the
// device is in test_offload_capacity.cpp. The host then holds only the
// copies' slots and the swap ring (Note [swap ring in the host allocator]),
// counted by the same allocator, and the run has the bits of the one with
// room for everything.
#include <doctest/doctest.h>

#include <string>

#include "checkpoint/temp_dir.h"
#include "engine/engine_harness.h"
#include "offload/memory_as_estimated.h"
#include "zest/core/units.h"
#include "zest/estimate/memory_estimate.h"

namespace test_offload_nvme_capacity {

using namespace zest;
using namespace zest::test;

namespace {

// `units` units of one 64K-element weight: the caching allocator's
// segments hold the slots and the ring with little rounding.
RunOptions wide_model(int world, int units, size_t host_capacity) {
  RunOptions opt = runs(world, 3);
  opt.host_capacity = host_capacity;
  opt.forward_then_backward = false;
  opt.model = [units](Engine& engine) {
    for (int u = 0; u < units; ++u) engine.add_unit(fmt::format("l{}", u), {{fmt::format("l{}.w", u), {256, 256}}});
  };
  return opt;
}

ModelDescription wide_description(int units) {
  ModelDescription m;
  m.units = {{"l", {65536}, static_cast<size_t>(units)}};
  return m;
}

EngineConfig wide_config(int stage) {
  EngineConfig c = base_config(stage);
  c.bf16 = true;
  c.gradient_clipping = 1.0;
  // Reduce buckets of two units: many buckets a step.
  c.zero.stage3_prefetch_bucket_size = 65536;
  c.zero.stage3_max_live_parameters = 2 * 65536;
  c.zero.reduce_bucket_size = 2 * 65536;
  return c;
}

void check_trains_beyond_the_host(int stage, int world, int units, int buffer_count, size_t capacity) {
  CAPTURE(stage);
  CAPTURE(world);
  TempDir dir;
  EngineConfig config = wide_config(stage);
  const std::vector<RankResult> device = run_engine(config, wide_model(world, units, 0));

  config.offload_optimizer.device = OffloadDevice::kCpu;
  const std::vector<RankResult> cpu = run_engine(config, wide_model(world, units, 0));
  // A rank's model states, and what CPU offload puts on its host, are
  // several times the host.
  const double times = static_cast<double>(device[0].memory.model_states()) / static_cast<double>(capacity);
  CAPTURE(times);
  CHECK(times >= 4.0);
  const int64_t host_states = cpu[0].memory.host_model_states();
  CHECK(host_states >= 3 * static_cast<int64_t>(capacity));

  // With the host's memory limited, CPU offload cannot allocate the master
  // weights or the optimizer state: the caching allocator's message names
  // the bytes it was asked for.
  std::string oom;
  try {
    run_engine(config, wide_model(world, units, capacity));
  } catch (const OutOfMemoryError& e) {
    oom = e.what();
  }
  CAPTURE(oom);
  const auto asked = [&](int64_t bytes, MemoryCategory c) {
    return oom.find(fmt::format("out of memory on host (limited): tried to allocate {} for {}", format_bytes(bytes),
                                category_name(c))) != std::string::npos;
  };
  // The master, or one of AdamW's two state buffers.
  const int64_t master = cpu[0].memory.host(MemoryCategory::kMasterWeights).current;
  const int64_t state = cpu[0].memory.host(MemoryCategory::kOptimizerState).current / 2;
  CHECK((asked(master, MemoryCategory::kMasterWeights) || asked(state, MemoryCategory::kOptimizerState)));

  config.offload_optimizer.device = OffloadDevice::kNvme;
  config.offload_optimizer.nvme_path = dir.str();
  config.offload_optimizer.buffer_count = buffer_count;
  const std::vector<RankResult> nvme = run_engine(config, wide_model(world, units, capacity));
  EstimateOptions eo = EstimateOptions::from_config(config, world);
  const MemoryEstimate estimate = estimate_memory(wide_description(units), eo);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const RankResult& g = nvme[static_cast<size_t>(r)];
    REQUIRE(g.steps.size() == 3);
    for (const StepResult& s : g.steps) CHECK(s.applied);
    // The parameters of the runs with room for everything, bit for bit.
    for (const auto& [name, values] : g.params) {
      CAPTURE(name);
      CHECK(same_bits(values, device[static_cast<size_t>(r)].params.at(name)));
      CHECK(same_bits(values, cpu[static_cast<size_t>(r)].params.at(name)));
    }
    // The host allocator held at most the capacity at its peak, no master
    // or state, and the ring among its comm_buffers.
    CHECK(g.memory.host_peak_reserved <= static_cast<int64_t>(capacity));
    CHECK(g.memory.host_model_states() == 0);
    CHECK(g.memory.host_swap_buffers > 0);
    CHECK(g.memory.host(MemoryCategory::kCommBuffers).peak >= g.memory.host_swap_buffers);
    CHECK(g.memory.host_peak_reserved >= g.memory.host(MemoryCategory::kCommBuffers).peak);
    // The master and state are on the drive, as the estimator counts them.
    CHECK(g.memory.nvme_bytes() >= 2 * host_states);
    check_memory_as_estimated(g.memory, estimate);
  }
}

}  // namespace

// The caching allocator gives a request between 1 and 10 MiB a segment of
// 20 MiB (as PyTorch's does), so the models are large enough for a ring of
// 10 MiB or more, which it rounds to 2 MiB.
TEST_CASE("offload_optimizer nvme: 5x the host's memory in model states trains on one rank, cpu offload is out of memory") {
  // 128 units, 8M elements: bf16 model states of 128 MiB, CPU offload's
  // host part 96 MiB, in 16 chunks of 512K elements; the host of 24 MiB
  // holds the ring (two 6 MiB records) and the slots.
  check_trains_beyond_the_host(2, 1, 128, 2, 24 * kMiB);
}

TEST_CASE("offload_optimizer nvme: 4x the host's memory per rank trains at stage 3 on 2 ranks, cpu offload does not") {
  // 4M elements a rank: the ring four 3 MiB records.
  check_trains_beyond_the_host(3, 2, 128, 4, 16 * kMiB);
}

}  // namespace test_offload_nvme_capacity
