// The engine over MPI processes against the same run on in-process ranks
// (computed in every process): bit for bit where MPI's reduction order cannot
// change a float sum (2 ranks), within fp32 rounding otherwise.
#include <doctest/doctest.h>

#include "comm/mpi/mpi_test_util.h"
#include "engine/engine_harness.h"
#include "zest/comm/mpi_comm.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("every stage over MPI matches the in-process run of the same world size") {
  std::unique_ptr<Communicator> world = make_mpi_world(mpi_test_options());
  const int w = world->size();
  for (int stage : {0, 1, 2, 3}) {
    CAPTURE(stage);
    EngineConfig config = base_config(stage);
    config.gradient_accumulation_steps = 2;
    config.gradient_clipping = 0.5;
    const RunOptions opt = runs(w, 3);
    const RankResult mpi = run_rank(config, opt, *world);
    const std::vector<RankResult> local = run_engine(config, opt);
    const RankResult& expected = local[static_cast<size_t>(world->rank())];
    for (const auto& [name, values] : expected.params) {
      CAPTURE(name);
      const std::vector<float>& got = mpi.params.at(name);
      if (w <= 2) {
        CHECK(same_bits(got, values));
      } else {
        REQUIRE(got.size() == values.size());
        for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(values[i]).epsilon(1e-5));
      }
    }
    // The same communication, counted the same way.
    CHECK(mpi.last_step_counters.total_bytes_sent() == expected.last_step_counters.total_bytes_sent());
  }
}
