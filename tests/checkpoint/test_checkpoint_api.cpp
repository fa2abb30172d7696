// What a fine-tuning or resuming program asks of a checkpoint beyond the
// model: a weights-only load, and its own state saved alongside.
#include <doctest/doctest.h>

#include <filesystem>
#include <random>

#include "engine/engine_harness.h"
#include "temp_dir.h"
#include "zest/checkpoint/checkpoint.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

// On `world` ranks: a finalized engine (initial values from `init`), then
// `body`; returns rank 0's master parameters after it.
Params on_ranks(const EngineConfig& config, int world, const Initializer& init,
                const std::function<void(Engine&, Communicator&)>& body) {
  std::vector<Params> out(static_cast<size_t>(world));
  run_inprocess(world, [&](Communicator& comm) {
    CachingAllocator alloc(make_host_allocator());
    Engine engine(config, comm, alloc, Stream::default_for(Device::host()));
    register_model(engine);
    engine.finalize(init);
    body(engine, comm);
    out[static_cast<size_t>(comm.rank())] = master_params(engine);
  });
  return out[0];
}

void steps(Engine& engine, Communicator& comm, int64_t first, int64_t last) {
  RankResult r;
  run_steps(engine, comm, runs(1, 0), first, last, r);
}

}  // namespace

TEST_CASE("a weights-only load takes the saved parameters bit for bit and starts the optimizer afresh") {
  TempDir dir;
  EngineConfig adam = base_config(2);
  adam.fp16.enabled = true;  // a loss scaler that moved, which must not come along
  // Three Adam steps on 2 ranks, saved.
  const Params saved = on_ranks(adam, 2, init_values, [&](Engine& e, Communicator& c) {
    steps(e, c, 0, 3);
    save_checkpoint(e, dir.str());
  });
  const Initializer from_saved = [&](const ParamLayout& p, std::span<float> v) {
    std::copy(saved.at(p.name).begin(), saved.at(p.name).end(), v.begin());
  };
  CheckpointOptions weights;
  weights.weights_only = true;
  for (int stage : {0, 1, 3}) {
    for (int world : {1, 3}) {
      CAPTURE(stage);
      CAPTURE(world);
      EngineConfig config = base_config(stage);
      // The values: the saved parameters, bit for bit; nothing else came.
      // Steps first, so there is optimizer state and a step count to reset.
      const Params loaded = on_ranks(config, world, init_values, [&](Engine& e, Communicator& c) {
        steps(e, c, 5, 7);
        load_checkpoint(e, dir.str(), weights);
        CHECK(e.progress().applied_steps == 0);
        CHECK(e.progress().skipped_steps == 0);
        for (int u = 0; u < e.layout().num_units(); ++u) {
          for (int b = 1; b < e.shard_buffers(); ++b) {
            for (float x : e.read_shard(u, b)) REQUIRE(x == 0.0f);
          }
        }
      });
      check_same(loaded, saved);
      // Two steps after the load equal two steps of a fresh engine whose
      // initial values are the saved ones: the optimizer state is fresh.
      const Params fresh = on_ranks(config, world, from_saved, [&](Engine& e, Communicator& c) { steps(e, c, 0, 2); });
      const Params after = on_ranks(config, world, init_values, [&](Engine& e, Communicator& c) {
        steps(e, c, 5, 7);
        load_checkpoint(e, dir.str(), weights);
        steps(e, c, 0, 2);
      });
      check_same(after, fresh);
    }
  }
  // Another optimizer's checkpoint loads weights-only, and only so when it
  // lacks a state this one needs (test_load_changes.cpp: the other cases).
  EngineConfig sgd = base_config(1);
  sgd.optimizer.kind = OptimizerKind::kSgd;
  sgd.optimizer.momentum = 0.9f;
  check_same(on_ranks(sgd, 2, init_values, [&](Engine& e, Communicator&) { load_checkpoint(e, dir.str(), weights); }),
             saved);
  CHECK_THROWS_WITH_AS(
      on_ranks(sgd, 2, init_values, [&](Engine& e, Communicator&) { load_checkpoint(e, dir.str()); }),
      doctest::Contains("was saved with"), Error);
}
