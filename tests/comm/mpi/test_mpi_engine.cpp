// The engine over MPI processes against the same run on in-process ranks
// (computed in every process): bit for bit at every world size, since both
// backends add in rank order (Note [reductions over MPI] in comm/mpi_comm.cpp).
#include <doctest/doctest.h>

#include "comm/mpi/mpi_test_util.h"
#include "engine/engine_harness.h"
#include "zest/comm/mpi_comm.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("every stage over MPI matches the in-process run of the same world size") {
  std::unique_ptr<Communicator> world = make_mpi_world(mpi_test_options());
  const int w = world->size();
  // overlap_comm on: the reductions and gathers run on the communication
  // stream's own thread (Note [the host's communication thread]), calling
  // MPI while this thread calls it on the engine's other communicators. The
  // in-process reference runs them inline.
  for (int stage : {0, 1, 2, 3}) {
    for (bool overlap : {false, true}) {
      CAPTURE(stage);
      CAPTURE(overlap);
      EngineConfig config = base_config(stage);
      config.gradient_accumulation_steps = 2;
      config.gradient_clipping = 0.5;
      config.zero.reduce_bucket_size = 64;  // several buckets a micro-step
      EngineConfig reference = config;
      config.zero.overlap_comm = overlap;
      config.zero.host_comm_thread = overlap;  // whatever this machine's cores
      reference.zero.overlap_comm = false;
      const RunOptions opt = runs(w, 3);
      const RankResult mpi = run_rank(config, opt, *world);
      const std::vector<RankResult> local = run_engine(reference, opt);
      const RankResult& expected = local[static_cast<size_t>(world->rank())];
      for (const auto& [name, values] : expected.params) {
        CAPTURE(name);
        CHECK(same_bits(mpi.params.at(name), values));
      }
      // The same communication, counted the same way.
      CHECK(mpi.last_step_counters.total_bytes_sent() == expected.last_step_counters.total_bytes_sent());
    }
  }
}
