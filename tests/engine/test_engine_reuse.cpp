// Stage 3's stage3_max_reuse_distance (Note [stage-3 reuse distance] in
// engine_gather.cpp): which units stay gathered between their handles, as
// the comm counters count it (exactly), as the cost model and the memory
// estimator predict it, and that a kept copy is never used once the
// parameters have changed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>

#include "engine_harness.h"
#include "zest/estimate/cost_model.h"
#include "zest/estimate/memory_estimate.h"

using namespace zest;
using namespace zest::test;

namespace {

// engine_harness.h's register_model: a (98 parameters), b (41), c (33).
ModelDescription harness_model() {
  ModelDescription m;
  m.units = {{"a", {91, 7}, 1}, {"b", {35, 5, 1}, 1}, {"c", {33}, 1}};
  return m;
}

// The harness loop gathers a, b, c forward, then c, b, a backward,
// releasing each handle before the next gather. At release, unit k is kept
// when the parameters of the units after it in the recorded order, up to its
// backward use, are fewer than the distance: c has none, b has c twice (66),
// a has b and c twice (148).
uint64_t gathers_per_step(int64_t distance) {
  if (distance == 0) return 6;
  if (distance <= 66) return 5;   // c kept
  if (distance <= 148) return 4;  // b and c kept
  return 3;                       // all three
}

Topology one_host(int world) {
  Topology t;
  t.hosts = 1;
  t.ranks_per_host = world;
  t.intra = {1e9, 1e-6};
  t.inter = {1e8, 1e-5};
  return t;
}

}  // namespace

TEST_CASE("stage 3 gathers a unit again in backward only beyond stage3_max_reuse_distance: exact counts") {
  for (int world : {2, 4}) {
    for (int64_t distance : {int64_t{0}, int64_t{1}, int64_t{66}, int64_t{67}, int64_t{148}, int64_t{149},
                             int64_t{1'000'000'000}}) {
      for (int64_t prefetch : {int64_t{0}, int64_t{50'000'000}}) {
        CAPTURE(world);
        CAPTURE(distance);
        CAPTURE(prefetch);
        EngineConfig config = base_config(3);
        config.zero.stage3_max_reuse_distance = distance;
        config.zero.stage3_prefetch_bucket_size = prefetch;
        CostOptions o;
        o.estimate = EstimateOptions::from_config(config, world);
        o.topology = one_host(world);
        const CostEstimate cost = estimate_cost(harness_model(), o);
        uint64_t calls = 0, elements = 0;
        double bytes = 0.0;
        for (const TrafficCost& t : cost.traffic) {
          if (t.kind != CollectiveKind::kAllGather) continue;
          calls += t.calls;
          elements += t.elements;
          bytes += t.bytes_per_rank;
        }
        CHECK(calls == gathers_per_step(distance));
        // The second step replays the order the first one recorded; the
        // first, recording it, releases every unit with its handle.
        for (int steps : {1, 2}) {
          CAPTURE(steps);
          const std::vector<RankResult> res = run_engine(config, runs(world, steps));
          for (const RankResult& r : res) {
            const CollectiveCounter& g = r.last_step_counters[CollectiveKind::kAllGather];
            CHECK(g.calls == (steps == 1 ? 6u : gathers_per_step(distance)));
            if (steps == 2) {
              CHECK(g.calls == calls);
              CHECK(g.elements == elements);
              CHECK(g.bytes_sent == bytes);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("the estimator's stage-3 parameter peak counts the units kept for their reuse, as measured") {
  // Prefetch window 0: one unit gathered at a time, unless kept.
  for (int world : {2, 4}) {
    for (int64_t distance : {int64_t{0}, int64_t{1}, int64_t{67}, int64_t{149}, int64_t{1'000'000'000}}) {
      CAPTURE(world);
      CAPTURE(distance);
      EngineConfig config = base_config(3);
      config.zero.stage3_max_reuse_distance = distance;
      config.zero.stage3_prefetch_bucket_size = 0;
      const MemoryEstimate e = estimate_memory(harness_model(), EstimateOptions::from_config(config, world));
      const std::vector<RankResult> res = run_engine(config, runs(world, 3));
      for (const RankResult& r : res) {
        CHECK(r.memory[MemoryCategory::kParameters].peak == e[MemoryCategory::kParameters].peak);
        CHECK(r.memory[MemoryCategory::kGradients].peak <= e[MemoryCategory::kGradients].peak);
      }
      // What the kept units add: all three gathered at once from distance
      // 149, the largest alone below it (a, 98 parameters, outweighs b + c).
      const ModelLayout layout({{"default", 0.0f}, {"no_decay", 0.0f}},
                               {{"a", {{"a.w", {7, 13}}, {"a.b", {7}, "no_decay"}}},
                                {"b", {{"b.w", {5, 7}}, {"b.b", {5}, "no_decay"}, {"b.s", {}, "no_decay"}}},
                                {"c", {{"c.w", {11, 3}}}}},
                               world);
      const size_t a = layout.unit(0).padded, b = layout.unit(1).padded, c = layout.unit(2).padded;
      const size_t shards = (a + b + c) / static_cast<size_t>(world);
      const size_t live = distance >= 149 ? a + b + c : (distance >= 67 ? std::max(a, b + c) : a);
      CHECK(e[MemoryCategory::kParameters].peak == static_cast<int64_t>((shards + live) * 4));
      CHECK(e.live_units == (distance >= 149 ? 3u : distance >= 67 ? 2u : 1u));
    }
  }
}

TEST_CASE("a unit kept for its reuse is never read after the parameters change") {
  // Unit a is used twice a micro-step (a tied weight: its gradients, then a
  // read at the end), so at distance 1e9 it stays gathered in between. From
  // the third step the loop skips the second read: a is still kept when
  // step() updates the parameters, and the next gather must bring the new
  // ones, not the kept copy. Every gather is checked against the master
  // weights (fp32: the parameters themselves) read before it.
  for (int world : {2, 4}) {
    CAPTURE(world);
    run_inprocess(world, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(base_config(3), comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
      const Stream stream = engine.stream();
      const auto check_fresh = [&](UnitHandle& h, int u, const std::map<std::string, std::vector<float>>& master) {
        for (const ParamLayout& p : engine.layout().unit(u).params) {
          std::vector<float> got(p.numel);
          copy_bytes(stream, got.data(), h.param<float>(p.name).data(), p.numel * 4);
          stream.synchronize();
          CHECK(std::memcmp(got.data(), master.at(p.name).data(), p.numel * 4) == 0);
        }
      };
      for (int64_t s = 0; s < 5; ++s) {
        CAPTURE(s);
        const std::map<std::string, std::vector<float>> master = master_params(engine);
        comm.reset_counters();
        for (int u = 0; u < 3; ++u) {
          UnitHandle h = engine.gather(u);
          check_fresh(h, u, master);
          write_grads<float>(engine, u, comm.rank(), s, 0, Backward{});
        }
        if (s < 2) {
          UnitHandle h = engine.gather(0);  // the tied read
          check_fresh(h, 0, master);
        }
        (void)engine.step();
        // Step 0 records (every unit released: 4 gathers, write_grads'
        // gathers of a held unit are none); step 1 keeps a (3); steps 2-4
        // skip the read (3).
        CHECK(comm.counters()[CollectiveKind::kAllGather].calls == (s == 0 ? 4u : 3u));
        // Nothing gathered is left after the step: the shards alone.
        CHECK(nothing_gathered(engine));
      }
    });
  }
}

TEST_CASE("a loop that strays from the recorded order releases units with their handles, then records anew") {
  // Recorded: a, b, c forward, c, b, a backward. Step 2 goes backward a, b,
  // c: the order is lost at its fourth gather. The units kept in forward
  // serve their backward use (no gather), each released with its handle
  // from then on; step 3 records the new order (every unit released: 6
  // gathers), step 4 replays it (a, b, c kept: 3). Results stay those of the
  // same loop at distance 0, bit for bit.
  const auto run = [](int64_t distance, int world) {
    EngineConfig config = base_config(3);
    config.zero.stage3_max_reuse_distance = distance;
    std::vector<std::vector<uint64_t>> calls(static_cast<size_t>(world));
    std::vector<std::map<std::string, std::vector<float>>> params(static_cast<size_t>(world));
    run_inprocess(world, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
      for (int64_t s = 0; s < 5; ++s) {
        comm.reset_counters();
        for (int u = 0; u < 3; ++u) UnitHandle h = engine.gather(u);
        for (int i = 0; i < 3; ++i) {
          const int u = s < 2 ? 2 - i : i;
          write_grads<float>(engine, u, comm.rank(), s, 0, Backward{});
        }
        (void)engine.step();
        calls[static_cast<size_t>(comm.rank())].push_back(comm.counters()[CollectiveKind::kAllGather].calls);
      }
      params[static_cast<size_t>(comm.rank())] = master_params(engine);
    });
    return std::make_pair(calls, params);
  };
  for (int world : {2, 4}) {
    CAPTURE(world);
    const auto [kept_calls, kept_params] = run(1'000'000'000, world);
    const auto [plain_calls, plain_params] = run(0, world);
    for (int r = 0; r < world; ++r) {
      CAPTURE(r);
      CHECK(kept_calls[static_cast<size_t>(r)] == std::vector<uint64_t>{6, 3, 3, 6, 3});
      CHECK(plain_calls[static_cast<size_t>(r)] == std::vector<uint64_t>{6, 6, 6, 6, 6});
      check_same(kept_params[static_cast<size_t>(r)], plain_params[static_cast<size_t>(r)]);
    }
  }
}
