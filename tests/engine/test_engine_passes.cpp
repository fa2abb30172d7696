// Stage 3's gather order per kind of pass (Note [a gather order per kind of
// pass] in engine_gather.cpp): inference passes between steps leave
// training's recorded order alone and nothing gathered after them, and
// end_forward() makes an inference loop's order one forward. Exact
// all-gather counts on the harness model: a (98 parameters), b (41), c (33),
// every unit sharded, no prefetch (every gather is the caller's), a reuse
// distance that keeps whatever the order uses again.
#include <doctest/doctest.h>

#include "engine_harness.h"

using namespace zest;
using namespace zest::test;

namespace {

EngineConfig keeping_config() {
  EngineConfig config = base_config(3);
  config.zero.stage3_max_reuse_distance = 1'000'000'000;
  config.zero.stage3_prefetch_bucket_size = 0;
  return config;
}

// One forward with no backward: a, b, c and a again (a tied weight read at
// the end), each handle released before the next gather.
void inference_forward(Engine& engine) {
  for (int u : {0, 1, 2, 0}) UnitHandle h = engine.gather(u, Pass::kInference);
}

// One training iteration: a, b, c forward, then c, b, a backward.
void training_iteration(Engine& engine, Communicator& comm, int64_t step) {
  for (int u = 0; u < 3; ++u) UnitHandle h = engine.gather(u);
  for (int u = 2; u >= 0; --u) write_grads<float>(engine, u, comm.rank(), step, 0, Backward{});
  (void)engine.step();
}

uint64_t gathers(Communicator& comm) { return comm.counters()[CollectiveKind::kAllGather].calls; }

}  // namespace

TEST_CASE("an inference pass between steps neither breaks training's order nor leaves a unit gathered") {
  // Training records over its first iteration (6 gathers) and replays after
  // (a, b, c kept from forward to backward: 3), evaluation or not; the
  // inference pass records (4) and replays (a kept for its second read: 3).
  // Ended by end_forward() or by the next training gather, alike.
  for (int world : {2, 4}) {
    for (bool end_forward : {false, true}) {
      std::vector<std::map<std::string, std::vector<float>>> without;
      for (bool evaluate : {false, true}) {
        CAPTURE(world);
        CAPTURE(end_forward);
        CAPTURE(evaluate);
        std::vector<std::map<std::string, std::vector<float>>> params(static_cast<size_t>(world));
        run_inprocess(world, [&](Communicator& comm) {
          CachingAllocator alloc(make_host_allocator());
          Engine engine(keeping_config(), comm, alloc, Stream::default_for(Device::host()));
          register_model(engine);
          engine.finalize(init_values);
          std::vector<uint64_t> training, inference;
          for (int64_t s = 0; s < 5; ++s) {
            if (evaluate) {
              comm.reset_counters();
              inference_forward(engine);
              if (end_forward) engine.end_forward();
              inference.push_back(gathers(comm));
              CHECK(nothing_gathered(engine));
            }
            comm.reset_counters();
            training_iteration(engine, comm, s);
            training.push_back(gathers(comm));
            CHECK(nothing_gathered(engine));
          }
          CHECK(training == std::vector<uint64_t>{6, 3, 3, 3, 3});
          if (evaluate) CHECK(inference == std::vector<uint64_t>{4, 3, 3, 3, 3});
          params[static_cast<size_t>(comm.rank())] = master_params(engine);
        });
        // What evaluation gathers changes nothing: the same bits as without.
        if (!evaluate) {
          without = params;
        } else {
          for (int r = 0; r < world; ++r) check_same(params[static_cast<size_t>(r)], without[static_cast<size_t>(r)]);
        }
      }
    }
  }
}

TEST_CASE("end_forward() makes the inference order one forward, and without it a pass runs to the next training gather") {
  for (int world : {2, 4}) {
    CAPTURE(world);
    run_inprocess(world, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      Engine engine(keeping_config(), comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
      const auto forwards = [&](int n, bool end_each) {
        comm.reset_counters();
        for (int i = 0; i < n; ++i) {
          inference_forward(engine);
          if (end_each) engine.end_forward();
        }
        return gathers(comm);
      };
      // One forward per pass: recorded (4), then replayed (3 each).
      CHECK(forwards(1, true) == 4);
      CHECK(forwards(2, true) == 6);
      // Three forwards in one pass stray from the one-forward order at the
      // second forward's first gather: 3 + 4 + 4, each unit released with
      // its handle from there on.
      CHECK(forwards(3, false) == 11);
      int64_t step = 0;
      training_iteration(engine, comm, step++);  // ends the pass
      CHECK(nothing_gathered(engine));
      // The next pass records the three forwards (12); the one after
      // replays them, every unit kept from one use to the next, since the
      // order uses each again within the distance: a, b and c once each.
      CHECK(forwards(3, false) == 12);
      training_iteration(engine, comm, step++);
      CHECK(forwards(3, false) == 3);
      engine.end_forward();
      CHECK(nothing_gathered(engine));
    });
  }
}

TEST_CASE("an inference order never ended stops recording at its limit and records again after a pass ends") {
  // 22,000 forwards of a, b, c: 66,000 gathers, past the 65,536 an order
  // records without a pass's end. Every unit is released with its handle
  // all along (3 per forward); after end_forward() the next forward
  // records (4) and the one after replays (3).
  run_inprocess(2, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(keeping_config(), comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init_values);
    comm.reset_counters();
    for (int i = 0; i < 22'000; ++i) {
      for (int u = 0; u < 3; ++u) UnitHandle h = engine.gather(u, Pass::kInference);
    }
    CHECK(gathers(comm) == 66'000);
    CHECK(nothing_gathered(engine));
    engine.end_forward();
    comm.reset_counters();
    inference_forward(engine);
    engine.end_forward();
    CHECK(gathers(comm) == 4);
    comm.reset_counters();
    inference_forward(engine);
    engine.end_forward();
    CHECK(gathers(comm) == 3);
  });
}

TEST_CASE("inference passes and end_forward() change no bit of training, at every stage") {
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    std::vector<std::map<std::string, std::vector<float>>> plain(2), mixed(2);
    for (bool evaluate : {false, true}) {
      run_inprocess(2, [&](Communicator& comm) {
        CachingAllocator alloc(make_host_allocator());
        Engine engine(base_config(stage), comm, alloc, Stream::default_for(Device::host()));
        CHECK_THROWS_WITH_AS(engine.end_forward(), doctest::Contains("end_forward(): call finalize() first"), Error);
        register_model(engine);
        engine.finalize(init_values);
        for (int64_t s = 0; s < 3; ++s) {
          if (evaluate) {
            engine.end_forward();  // none begun: nothing to end
            inference_forward(engine);
            if (s == 1) engine.end_forward();
          }
          training_iteration(engine, comm, s);
        }
        (evaluate ? mixed : plain)[static_cast<size_t>(comm.rank())] = master_params(engine);
      });
    }
    for (size_t r = 0; r < 2; ++r) check_same(mixed[r], plain[r]);
  }
}

TEST_CASE("a gather outside the passes (Pass::kNone) follows no order: before the first iteration and between steps") {
  // As TorchModule's construction reads the persistent units, and a loop
  // reads a weight between steps: training's order stays that of its
  // iterations. c (33 parameters) persistent at a threshold of 40, or none.
  for (int64_t threshold : {int64_t{0}, int64_t{40}}) {
    CAPTURE(threshold);
    run_inprocess(2, [&](Communicator& comm) {
      CachingAllocator alloc(make_host_allocator());
      EngineConfig config = keeping_config();
      config.zero.stage3_param_persistence_threshold = threshold;
      Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
      register_model(engine);
      engine.finalize(init_values);
      { const UnitHandle h = engine.gather(2, Pass::kNone); }
      std::vector<uint64_t> training, outside;
      for (int64_t s = 0; s < 4; ++s) {
        comm.reset_counters();
        training_iteration(engine, comm, s);
        training.push_back(gathers(comm));
        comm.reset_counters();
        { const UnitHandle h = engine.gather(1, Pass::kNone); }
        outside.push_back(gathers(comm));
        CHECK(nothing_gathered(engine) == (threshold == 0));
      }
      // c persistent: gathered only after each step (its update), a and b
      // as before: 2 + 2 + 1 recording, 2 + 1 replaying.
      CHECK(training == (threshold == 0 ? std::vector<uint64_t>{6, 3, 3, 3} : std::vector<uint64_t>{5, 3, 3, 3}));
      CHECK(outside == std::vector<uint64_t>{1, 1, 1, 1});
    });
  }
}
