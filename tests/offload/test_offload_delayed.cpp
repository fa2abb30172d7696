// offload_optimizer.delayed_update: the update of step t's gradients runs
// on a host thread while step t+1's forward and backward do, and its
// parameters reach the device at step t+1's step(): each forward sees the
// parameters one applied step behind the undelayed run's, and the master
// weights, once settled, are the undelayed run's when the gradients do not
// depend on the parameters.
#include <doctest/doctest.h>

#include <cstring>

#include "engine/engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {

EngineConfig offloaded(EngineConfig c, bool delayed) {
  c.offload_optimizer.device = OffloadDevice::kCpu;
  c.offload_optimizer.delayed_update = delayed;
  return c;
}

// The compute-dtype bytes of every unit's parameters, as a forward sees them.
std::vector<std::byte> device_params(Engine& engine) {
  std::vector<std::byte> out;
  const size_t bc = elem_size(engine.compute_dtype());
  for (int u = 0; u < engine.layout().num_units(); ++u) {
    const size_t bytes = engine.layout().unit(u).padded * bc;
    UnitHandle h = engine.gather(u);
    const size_t at = out.size();
    out.resize(at + bytes);
    copy_bytes(engine.stream(), out.data() + at, h.data(), bytes);
    engine.stream().synchronize();
  }
  return out;
}

// Rank 0's parameters as the forward of each step 0..steps sees them, with
// gradients that do not depend on the parameters.
std::vector<std::vector<std::byte>> forward_params(const EngineConfig& config, int world, int steps) {
  RunOptions opt = runs(world, 0);
  opt.backward.integer_valued = true;
  std::vector<std::vector<std::byte>> seen;
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    CachingAllocator host(make_host_allocator());
    const std::unique_ptr<Engine> engine =
        finalized_engine(config, comm, alloc, host, Stream::default_for(Device::host()));
    RankResult r;
    for (int s = 0; s <= steps; ++s) {
      std::vector<std::byte> p = device_params(*engine);
      if (comm.rank() == 0) seen.push_back(std::move(p));
      if (s < steps) run_steps(*engine, comm, opt, s, s + 1, r);
    }
  });
  return seen;
}

}  // namespace

TEST_CASE("delayed_update: settled master weights equal the undelayed run's when gradients ignore the parameters") {
  for (bool bf16 : {false, true}) {
    EngineConfig config = base_config(1);
    config.bf16 = bf16;
    config.gradient_accumulation_steps = 2;
    RunOptions opt = runs(1, 4);
    opt.backward.integer_valued = true;  // independent of the parameters
    for (int stage : {1, 2, 3}) {
      for (int world : {1, 2}) {
        CAPTURE(bf16);
        CAPTURE(stage);
        CAPTURE(world);
        config.zero.stage = stage;
        opt.world = world;
        const std::vector<RankResult> now = run_engine(offloaded(config, false), opt);
        const std::vector<RankResult> later = run_engine(offloaded(config, true), opt);
        for (int r = 0; r < world; ++r) check_same(later[static_cast<size_t>(r)].params, now[static_cast<size_t>(r)].params);
      }
    }
  }
}

TEST_CASE("delayed_update: each forward sees the parameters of one applied step before") {
  for (int stage : {1, 3}) {
    CAPTURE(stage);
    EngineConfig config = base_config(stage);
    config.bf16 = true;
    const int steps = 4;
    const auto now = forward_params(offloaded(config, false), 2, steps);
    const auto later = forward_params(offloaded(config, true), 2, steps);
    REQUIRE(now.size() == steps + 1);
    REQUIRE(later.size() == steps + 1);
    // Step 1's forward: the initial values in both; step s's the values
    // the undelayed run had one step before.
    CHECK(later[0] == now[0]);
    CHECK(now[1] != now[0]);  // the steps moved the parameters
    for (int s = 1; s <= steps; ++s) {
      CAPTURE(s);
      CHECK(later[static_cast<size_t>(s)] == now[static_cast<size_t>(s - 1)]);
    }
  }
}
