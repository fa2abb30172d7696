// Memory by category and communication volume per step, measured through
// the allocator's tags and the communicator's counters, against the ZeRO
// paper's formulas (with ZEST's documented padding).
#include <doctest/doctest.h>

#include <algorithm>

#include "engine_harness.h"
#include "zest/engine/layout_constants.h"

using namespace zest;
using namespace zest::test;

namespace {

// Flat sizes of the harness model's units for P partitions.
std::vector<size_t> padded_units(int partitions) {
  ModelLayout layout({{"default", 0.0f}, {"no_decay", 0.0f}},
                     {{"a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}}},
                      {"b", {{"b.w", {5, 7}}, {"b.b", {5}, "no_decay"}, {"b.s", {}, "no_decay"}}},
                      {"c", {{"c.w", {11, 3}}}}},
                     partitions);
  std::vector<size_t> out;
  for (const UnitLayout& u : layout.units()) out.push_back(u.padded);
  return out;
}

}  // namespace

TEST_CASE("per-rank model-state bytes follow the ZeRO formula of each stage") {
  for (int world : {1, 3, 4}) {
    for (int stage : {0, 1, 2, 3}) {
      CAPTURE(world);
      CAPTURE(stage);
      EngineConfig config = base_config(stage);
      config.bf16 = true;  // 2-byte parameters and gradients, fp32 master, AdamW: K = 12
      const std::vector<RankResult> res = run_engine(config, runs(world, 1));
      const int P = stage == 0 ? 1 : world;
      int64_t psi = 0;  // padded parameters, the Ψ of the formula
      for (size_t n : padded_units(P)) psi += static_cast<int64_t>(n);
      const int64_t shard = psi / P;
      const int64_t params = stage == 3 ? 2 * shard : 2 * psi;
      const int64_t grads = stage >= 2 ? 2 * shard : 2 * psi;
      for (const RankResult& r : res) {
        CHECK(r.memory[MemoryCategory::kParameters].current == params);
        CHECK(r.memory[MemoryCategory::kGradients].current == grads);
        CHECK(r.memory[MemoryCategory::kMasterWeights].current == 4 * shard);
        CHECK(r.memory[MemoryCategory::kOptimizerState].current == 8 * shard);
        CHECK(r.memory[MemoryCategory::kCommBuffers].current == 0);
        CHECK(r.memory.model_states() == params + grads + 12 * shard);
      }
    }
  }
}

TEST_CASE("fp32 training keeps no separate master copy, accumulation adds an accumulator at stages 0-1") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    EngineConfig config = base_config(stage);
    config.gradient_accumulation_steps = 2;
    const std::vector<RankResult> res = run_engine(config, runs(2, 1));
    const int P = stage == 0 ? 1 : 2;
    int64_t psi = 0;
    for (size_t n : padded_units(P)) psi += static_cast<int64_t>(n);
    const int64_t shard = psi / P;
    const int64_t grads = stage >= 2 ? 4 * shard : 4 * psi + 4 * shard;
    CHECK(res[1].memory[MemoryCategory::kMasterWeights].current == 0);
    CHECK(res[1].memory[MemoryCategory::kGradients].current == grads);
    CHECK(res[1].memory[MemoryCategory::kParameters].current == (stage == 3 ? 4 * shard : 4 * psi));
  }
}

// The paper's 3Ψ at stage 3 gathers every unit again for backward:
// stage3_max_reuse_distance 0. At DeepSpeed's default (1e9) this small model
// keeps every unit gathered from its forward to its backward: 2Ψ, one
// gather a unit (test_engine_reuse.cpp has the distances in between).
TEST_CASE("communication per step: 2Ψ(W-1)/W for stages 0-2, 3Ψ(W-1)/W for stage 3") {
  for (int world : {2, 3, 4}) {
    for (int stage : {0, 1, 2, 3, 4}) {  // 4: stage 3 at the default reuse distance
      CAPTURE(world);
      CAPTURE(stage);
      EngineConfig config = base_config(std::min(stage, 3));
      config.fp16.enabled = true;
      if (stage == 3) config.zero.stage3_max_reuse_distance = 0;
      const std::vector<RankResult> res = run_engine(config, runs(world, 2));
      int64_t psi = 0;
      for (size_t n : padded_units(stage == 0 ? 1 : world)) psi += static_cast<int64_t>(n);
      const double w = world;
      const double volumes = stage == 3 ? 3.0 : 2.0;
      for (const RankResult& r : res) {
        const CommCounters& c = r.last_step_counters;
        const double sent_elements = c.total_bytes_sent() / 2.0;  // fp16
        CHECK(sent_elements == doctest::Approx(volumes * static_cast<double>(psi) * (w - 1) / w).epsilon(1e-12));
        CHECK(c.total_bytes_received() == c.total_bytes_sent());
        CHECK(c[CollectiveKind::kBroadcast].calls == 0);
        if (stage == 0) {
          CHECK(c[CollectiveKind::kAllReduce].calls == 3);  // one per unit
          CHECK(c[CollectiveKind::kReduceScatter].calls == 0);
        } else {
          CHECK(c[CollectiveKind::kAllReduce].calls == 0);
          CHECK(c[CollectiveKind::kReduceScatter].calls == 3);
          // stage 3 at distance 0: each unit gathered for forward and again
          // for backward; at the default once, kept in between
          CHECK(c[CollectiveKind::kAllGather].calls == (stage == 3 ? 6u : 3u));
        }
      }
    }
  }
}

TEST_CASE("whole-unit views: data() holds every parameter and gradient at its offset") {
  for (int stage : {0, 2, 3}) {
    CAPTURE(stage);
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(base_config(stage), comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
      for (int u = 0; u < engine.layout().num_units(); ++u) {
        CHECK(engine.persistent(u) == (stage < 3));  // base_config: no persistence threshold
        UnitHandle h = engine.gather(u);
        GradHandle g = engine.grads(u);
        const auto* base = static_cast<const float*>(h.data());
        auto* gbase = static_cast<float*>(g.data());
        for (const ParamLayout& p : engine.layout().unit(u).params) {
          CHECK(h.param_data(p.name) == base + p.offset);
          CHECK(g.grad_data(p.name) == gbase + p.offset);
          // The values are the initializer's, so the view is the right memory.
          std::vector<float> want(p.numel);
          init_values(p, want);
          CHECK(std::memcmp(base + p.offset, want.data(), p.numel * 4) == 0);
        }
        g.done();
        CHECK_THROWS_WITH_AS((void)g.data(), doctest::Contains("used after done()"), Error);
        h.release();
        CHECK_THROWS_WITH_AS((void)h.data(), doctest::Contains("released UnitHandle"), Error);
      }
      (void)engine.step();
    });
  }
}

TEST_CASE("one rank runs no collective, and its stage-3 units stay whole") {
  // Note [one rank reduces nothing] (engine_grads.cpp) and Note [one
  // partition keeps stage 3 resident] (layout_constants.h): over one rank
  // the reduction and the gathers are identities, so nothing is copied.
  for (int stage : {0, 1, 2, 3}) {
    for (int64_t gas : {1, 2}) {
      CAPTURE(stage);
      CAPTURE(gas);
      EngineConfig config = base_config(stage);  // no persistence threshold
      config.gradient_accumulation_steps = gas;
      const RankResult r = run_engine(config, runs(1, 2))[0];
      for (CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                                  CollectiveKind::kAllGather, CollectiveKind::kBroadcast}) {
        CHECK(r.last_step_counters[kind].calls == 0);
      }
      // No gathered copy beside the shards at any time: the peak is the
      // parameters themselves.
      int64_t psi = 0;
      for (size_t n : padded_units(1)) psi += static_cast<int64_t>(n);
      CHECK(r.memory[MemoryCategory::kParameters].peak == 4 * psi);
      CHECK(r.memory[MemoryCategory::kParameters].current == 4 * psi);
    }
  }
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(base_config(3), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    for (int u = 0; u < engine.layout().num_units(); ++u) CHECK(engine.persistent(u));
  });
  // offload_param keeps the shards in host memory: gathered to the device.
  EngineConfig config = base_config(3);
  config.offload_optimizer.device = OffloadDevice::kCpu;
  config.offload_param.device = OffloadDevice::kCpu;
  run_inprocess(1, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    for (int u = 0; u < engine.layout().num_units(); ++u) CHECK(!engine.persistent(u));
  });
}

TEST_CASE("stage 3 peaks below stage 2 by the parameters it does not keep, when its prefetch window is one unit") {
  // 8 units of 16384 fp32 parameters on 2 ranks. Stage 2 keeps every full
  // unit; stage 3 keeps its shards and gathers one unit at a time when
  // nothing is prefetched (a window smaller than a unit), or every unit at
  // once when the window holds the model (DeepSpeed's default, 5e7
  // elements, for a model this small). One at a time needs
  // stage3_max_reuse_distance 0 too: at its default (1e9) every unit stays
  // gathered from its forward to its backward, all at once at the turn.
  constexpr int kUnits = 8;
  constexpr int64_t kNumel = 16384;
  RunOptions opt = runs(2, 2);
  opt.model = [](Engine& e) {
    for (int u = 0; u < kUnits; ++u) e.add_unit(fmt::format("u{}", u), {{fmt::format("u{}.w", u), {kNumel}}});
  };
  const int64_t unit = kNumel * 4, full = kUnits * unit, shard = full / 2;
  const RankResult two = run_engine(base_config(2), opt)[0];
  EngineConfig config = base_config(3);
  config.zero.stage3_prefetch_bucket_size = 1;
  config.zero.stage3_max_reuse_distance = 0;
  const RankResult three = run_engine(config, opt)[0];
  config.zero.stage3_prefetch_bucket_size = 50'000'000;
  const RankResult whole = run_engine(config, opt)[0];
  config.zero.stage3_prefetch_bucket_size = 1;
  config.zero.stage3_max_reuse_distance = 1'000'000'000;
  CHECK(run_engine(config, opt)[0].memory[MemoryCategory::kParameters].peak == shard + full);

  CHECK(two.memory[MemoryCategory::kParameters].peak == full);
  CHECK(three.memory[MemoryCategory::kParameters].peak == shard + unit);
  CHECK(whole.memory[MemoryCategory::kParameters].peak == shard + full);
  // The whole process's share: every category at once, as the allocator
  // held it. Stage 3 is below stage 2 by the model-state difference, less
  // the one unit it holds gathered.
  const int64_t difference = two.memory.model_states() - three.memory.model_states();
  CHECK(difference == full - shard);
  CHECK(three.memory.peak_allocated <= two.memory.peak_allocated - difference + unit);
  CHECK(whole.memory.peak_allocated > two.memory.peak_allocated);
  for (const RankResult* r : {&two, &three, &whole}) {
    const MemoryReport& m = r->memory;
    CHECK(m.peak_reserved >= m.peak_allocated);
    CHECK(m.peak_allocated >= m.model_states());
    // A host run: the device allocator's memory is the process's.
    CHECK(m.engine_host_peak == m.peak_reserved + m.host_peak_reserved);
#ifdef __linux__
    CHECK(m.process_rss > 0);
    CHECK(m.process_peak_rss >= m.process_rss);
    CHECK(m.unaccounted_peak() == m.process_peak_rss - m.engine_host_peak);
#endif
  }
}
