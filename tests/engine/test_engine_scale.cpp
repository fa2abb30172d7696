// step() at a model size threads cannot run: one real rank of a simulated
// world of up to 8192 ranks (simulated_world.h) holding 64 units of 256
// elements each, so the model grows with the world (to 134M parameters)
// while the rank's shard stays 16,384 elements. What step() allocates, what
// it sends, what the rank keeps and how long step() takes must stay those of
// the shard; the estimator must say the same.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <string>

#include "engine_harness.h"
#include "simulated_world.h"
#include "zest/estimate/memory_estimate.h"

using namespace zest;
using namespace zest::test;

namespace {

constexpr int kUnits = 64;
constexpr size_t kShardPerUnit = 256;  // elements of each unit a rank owns

struct ScaleRun {
  size_t padded = 0;             // the model, Ψ'
  size_t owned = 0;              // this rank's shard
  int64_t step_alloc = 0;        // bytes step() asked for at its peak, beyond what was live before
  int64_t step_norm_bytes = 0;   // of which the norm's workspace (comm buffers)
  int64_t model_states = 0;      // after the last step
  uint64_t step_data_bytes = 0;  // sent over the data communicator inside step()
  double best_step_ms = 1e300;
  MemoryEstimate estimate;
  double norm = 0.0;
};

ScaleRun run_simulated(int world) {
  SimulatedWorld comm(0, world);
  CachingAllocator alloc(make_host_allocator());
  const OwnedStream stream(Device::host());
  EngineConfig config = base_config(3);  // every unit sharded: no persistence threshold
  Engine engine(config, comm, alloc, stream);
  ModelDescription model;
  const size_t unit_numel = kShardPerUnit * static_cast<size_t>(world);
  for (int u = 0; u < kUnits; ++u) {
    engine.add_unit("u" + std::to_string(u), {{"u" + std::to_string(u) + ".w", {static_cast<int64_t>(unit_numel)}}});
    model.units.push_back({"u" + std::to_string(u), {unit_numel}, 1});
  }
  engine.finalize([](const ParamLayout&, std::span<float> v) { std::fill(v.begin(), v.end(), 0.25f); },
                  InitFrom::kEveryRank);
  ScaleRun out;
  out.padded = engine.layout().padded();
  out.owned = engine.layout().owned();
  out.estimate = estimate_memory(model, EstimateOptions::from_config(config, world));
  for (int s = 0; s < 4; ++s) {
    for (int u = kUnits - 1; u >= 0; --u) {  // backward: only this rank's part carries a gradient
      UnitHandle h = engine.gather(u);
      GradHandle g = engine.grads(u);
      std::span<float> grad = g.grad<float>("u" + std::to_string(u) + ".w");
      std::fill_n(grad.begin() + static_cast<std::ptrdiff_t>(comm.rank() * kShardPerUnit), kShardPerUnit, 0.5f);
      g.done();
    }
    alloc.reset_peak_stats();
    const int64_t before = at(alloc.stats().requested_bytes, StatPool::kAggregate).current;
    const uint64_t sent_before = static_cast<uint64_t>(comm.counters().total_bytes_sent());
    const auto t0 = std::chrono::steady_clock::now();
    const StepResult r = engine.step();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    REQUIRE(r.applied);
    const AllocatorStats st = alloc.stats();
    out.step_alloc = at(st.requested_bytes, StatPool::kAggregate).peak - before;
    out.step_norm_bytes = st.category_requested(MemoryCategory::kCommBuffers).peak;
    out.step_data_bytes = static_cast<uint64_t>(comm.counters().total_bytes_sent()) - sent_before;
    out.best_step_ms = std::min(out.best_step_ms, ms);
    out.norm = r.grad_norm;
  }
  out.model_states = engine.memory_report().model_states();
  return out;
}

}  // namespace

TEST_CASE("step()'s memory, traffic and time follow the shard, from 131K to 134M parameters") {
  const ScaleRun small = run_simulated(8);
  const ScaleRun large = run_simulated(8192);
  CHECK(small.padded == kUnits * kShardPerUnit * 8);
  CHECK(large.padded == kUnits * kShardPerUnit * 8192);  // 134,217,728 parameters
  CHECK(small.owned == kUnits * kShardPerUnit);
  CHECK(large.owned == small.owned);

  // Memory: what step() allocates is the norm's workspace, one double per
  // 256 owned elements and the exact words; the estimate says so at both
  // sizes, and what the rank keeps is the same.
  CHECK(large.step_alloc == small.step_alloc);
  CHECK(large.step_alloc == large.step_norm_bytes);
  CHECK(large.step_alloc == large.estimate.norm_bytes);
  CHECK(small.step_alloc == small.estimate.norm_bytes);
  CHECK(large.model_states == small.model_states);
  CHECK(large.model_states == large.estimate.model_state_bytes);

  // Traffic: none over the data communicator. The reduce bucket (a quarter
  // of the model: 16 units) was flushed by the last done(), stage 3 gathers
  // nothing after the update, and the norm's 22 words go over the engine's
  // own communicator.
  CHECK(small.step_data_bytes == 0);
  CHECK(large.step_data_bytes == 0);
  // The norm: every simulated rank's shard is 0.5 / 1 (one micro-step), so
  // the sum of squares is 0.25 x the whole model, exactly.
  CHECK(small.norm == std::sqrt(0.25 * static_cast<double>(kUnits * kShardPerUnit * 8)));
  CHECK(large.norm == std::sqrt(0.25 * static_cast<double>(kUnits * kShardPerUnit * 8192)));

  // Time: a step over the model would take ~1000x longer at 1024x the size;
  // the bound allows 10x and 2 ms of scheduling noise, the best of 4 steps.
  MESSAGE("step() best of 4: " << small.best_step_ms << " ms at 131,072 parameters, " << large.best_step_ms
                               << " ms at 134,217,728");
  CHECK(large.best_step_ms <= 10.0 * small.best_step_ms + 2.0);
}
