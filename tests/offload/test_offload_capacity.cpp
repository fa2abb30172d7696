// A model whose model states are several times the device trains with
// offload_optimizer, where without it the engine runs out of memory: on the
// host backend, the "device" a capacity-limited allocator
// (make_limited_allocator), the offloaded state in a second, host allocator.
#include <doctest/doctest.h>

#include <string>

#include "engine/engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {


// `units` units of one 64K-element weight each: bf16 parameters of 128 KiB
// per unit, which the caching allocator packs into 2 MiB segments, so the
// capacity is spent on the model and not on rounding.
RunOptions wide_model(int world, int units, size_t capacity) {
  RunOptions opt = runs(world, 2);
  opt.device_capacity = capacity;
  opt.forward_then_backward = false;
  opt.model = [units](Engine& engine) {
    for (int u = 0; u < units; ++u) engine.add_unit(fmt::format("l{}", u), {{fmt::format("l{}.w", u), {256, 256}}});
  };
  return opt;
}

EngineConfig wide_config(int stage) {
  EngineConfig c = base_config(stage);
  c.bf16 = true;
  c.gradient_clipping = 1.0;
  // Stage 3: one unit prefetched and a few in flight, as a large model would
  // be configured; the reduce bucket a few units.
  c.zero.stage3_prefetch_bucket_size = 65536;
  c.zero.stage3_max_live_parameters = 2 * 65536;
  c.zero.reduce_bucket_size = 2 * 65536;
  return c;
}

// Rank r of a run on a device of `capacity` bytes stayed within it, took
// both steps, and ended with the parameters of the unlimited `reference`.
void check_trained_within(const RankResult& g, const RankResult& reference, size_t capacity) {
  CHECK(g.memory.reserved <= static_cast<int64_t>(capacity));
  REQUIRE(g.steps.size() == 2);
  CHECK(g.steps[1].applied);
  for (const auto& [name, values] : g.params) {
    CAPTURE(name);
    CHECK(same_bits(values, reference.params.at(name)));
  }
}

void check_trains_beyond_the_device(int stage, int world, int units, size_t capacity) {
  CAPTURE(stage);
  CAPTURE(world);
  EngineConfig config = wide_config(stage);
  RunOptions unlimited = wide_model(world, units, 0);
  const std::vector<RankResult> reference = run_engine(config, unlimited);
  // What a rank's model states take without offload, against the device.
  const double times = static_cast<double>(reference[0].memory.model_states()) / static_cast<double>(capacity);
  CAPTURE(times);
  CHECK(times >= 3.0);

  RunOptions limited = wide_model(world, units, capacity);
  CHECK_THROWS_WITH_AS(run_engine(config, limited), doctest::Contains("out of memory on host (limited)"),
                       OutOfMemoryError);

  config.offload_optimizer.device = OffloadDevice::kCpu;
  const std::vector<RankResult> got = run_engine(config, limited);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const RankResult& g = got[static_cast<size_t>(r)];
    CHECK(g.memory.host_model_states() > 2 * static_cast<int64_t>(capacity));
    // It trained: the very parameters of the run with room for everything.
    check_trained_within(g, reference[static_cast<size_t>(r)], capacity);
  }
}

}  // namespace

TEST_CASE("offload: 3x the device's memory in model states trains on one rank, without offload it is out of memory") {
  check_trains_beyond_the_device(1, 1, 32, 10 * kMiB);
}

// Stage 3 with the optimizer offloaded, a rank's device still holds its
// parameter and gradient shards (2 + 2 bytes per owned bf16 element); with
// offload_param the parameters leave too. A device between the two trains
// only with both, and gets the bits of the unlimited run.
void check_params_offload_needed(int world, int units, size_t capacity) {
  CAPTURE(world);
  EngineConfig config = wide_config(3);
  config.offload_optimizer.device = OffloadDevice::kCpu;
  const std::vector<RankResult> reference = run_engine(config, wide_model(world, units, 0));
  const int64_t shards = reference[0].memory[MemoryCategory::kParameters].current;
  CHECK(reference[0].memory[MemoryCategory::kGradients].current == shards);
  CHECK(static_cast<int64_t>(capacity) < 2 * shards);
  CHECK(static_cast<int64_t>(capacity) > shards);

  RunOptions limited = wide_model(world, units, capacity);
  CHECK_THROWS_WITH_AS(run_engine(config, limited), doctest::Contains("out of memory on host (limited)"),
                       OutOfMemoryError);
  config.offload_param.device = OffloadDevice::kCpu;
  const std::vector<RankResult> got = run_engine(config, limited);
  for (int r = 0; r < world; ++r) {
    CAPTURE(r);
    const RankResult& g = got[static_cast<size_t>(r)];
    CHECK(g.memory.host(MemoryCategory::kParameters).current == shards);
    check_trained_within(g, reference[static_cast<size_t>(r)], capacity);
  }
}

TEST_CASE("offload_param at stage 3: a device too small for the parameter and gradient shards trains on 1 and 2 ranks") {
  // 64 units of 128 KiB: shards of 8 MiB (1 rank) and 4 MiB (2 ranks).
  check_params_offload_needed(1, 64, 12 * kMiB);
  check_params_offload_needed(2, 64, 6 * kMiB);
}

TEST_CASE("offload at stage 3: several times the device's memory per rank trains on 2 and 4 ranks") {
  check_trains_beyond_the_device(3, 2, 64, 10 * kMiB);
  check_trains_beyond_the_device(3, 4, 96, 8 * kMiB);
}
