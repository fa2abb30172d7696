// Note [the host's communication thread] (engine.cpp): with overlap_comm on
// the host, the reductions and stage 3's gathers run on the communication
// stream's own thread while backward goes on. The arithmetic is the same,
// element for element and in the same order, so every stage must end with
// the bits, the step results and the traffic of the same run with
// overlap_comm off, over several buckets and accumulation micro-steps.
#include <doctest/doctest.h>

#include "engine_harness.h"
#include "zest/engine/host_comm_thread.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("overlap_comm on the host changes no bit, no step result and no count, at every stage") {
  for (int stage : {0, 1, 2, 3}) {
    for (int world : {2, 3}) {
      CAPTURE(stage);
      CAPTURE(world);
      EngineConfig on = base_config(stage);
      on.gradient_accumulation_steps = 2;
      on.gradient_clipping = 0.5;
      on.zero.reduce_bucket_size = 64;  // a bucket per unit or two: several per micro-step
      on.zero.overlap_comm = true;
      on.zero.host_comm_thread = true;  // whatever this machine's cores
      EngineConfig off = on;
      off.zero.overlap_comm = false;
      const std::vector<RankResult> threaded = run_engine(on, runs(world, 4));
      const std::vector<RankResult> inline_run = run_engine(off, runs(world, 4));
      for (size_t r = 0; r < threaded.size(); ++r) {
        CAPTURE(r);
        check_same(threaded[r].params, inline_run[r].params);
        REQUIRE(threaded[r].steps.size() == inline_run[r].steps.size());
        for (size_t s = 0; s < threaded[r].steps.size(); ++s) {
          CHECK(threaded[r].steps[s].grad_norm == inline_run[r].steps[s].grad_norm);
          CHECK(threaded[r].steps[s].clipped == inline_run[r].steps[s].clipped);
        }
        for (CollectiveKind kind : {CollectiveKind::kAllReduce, CollectiveKind::kReduceScatter,
                                    CollectiveKind::kAllGather}) {
          CHECK(threaded[r].last_step_counters[kind].calls == inline_run[r].last_step_counters[kind].calls);
          CHECK(threaded[r].last_step_counters[kind].bytes_sent == inline_run[r].last_step_counters[kind].bytes_sent);
        }
      }
    }
  }
}

TEST_CASE("by default the host's communication thread needs a core to spare for each rank") {
  // Unbound (the process may run on every CPU): every rank on the host
  // shares them.
  CHECK_FALSE(core_to_spare(2, 2, 2, 2));  // 2 in-process ranks on 2 cores
  CHECK_FALSE(core_to_spare(2, 2, 1, 2));  // 2 processes on 2 cores
  CHECK(core_to_spare(4, 4, 2, 2));
  CHECK(core_to_spare(16, 16, 1, 8));
  CHECK_FALSE(core_to_spare(16, 16, 1, 9));
  // Bound to fewer CPUs than the host has: only this process's ranks share them.
  CHECK(core_to_spare(2, 16, 1, 8));
  CHECK_FALSE(core_to_spare(1, 16, 1, 8));
  CHECK_FALSE(core_to_spare(2, 16, 2, 2));
}
