// Sub-communicators, byte counters, construction and MPI's own settings.
#include <doctest/doctest.h>

#include <vector>

#include "comm/conformance.h"
#include "comm/mpi/mpi_test_util.h"
#include "zest/comm/mpi_comm.h"

using namespace zest;
using test::host_stream;

TEST_CASE("split makes groups by color, ordered by key, that run every collective") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  const int me = world->rank();
  // Even and odd ranks, each group in reverse rank order.
  std::unique_ptr<Communicator> half = world->split(me % 2, -me);
  REQUIRE(half != nullptr);
  const int same_parity = (w - me % 2 + 1) / 2;  // ranks of w with this rank's parity
  const int above_me = (w - 1 - me) / 2;         // of those, the ones above this rank
  CHECK(half->size() == same_parity);
  CHECK(half->rank() == above_me);
  CHECK(half->options().timeout == world->options().timeout);
  CHECK(half->backend_name() == "mpi");
  int32_t v = me;
  half->all_reduce(&v, &v, 1, DType::kInt32, ReduceOp::kSum, host_stream());
  int32_t expect = 0;
  for (int r = me % 2; r < w; r += 2) expect += r;
  CHECK(v == expect);
  test::check_all_collectives(*half, host_stream());

  // The parent keeps working, and its numbering counts the split.
  CHECK(world->sequence() == 1);
  int32_t all = 1;
  world->all_reduce(&all, &all, 1, DType::kInt32, ReduceOp::kSum, host_stream());
  CHECK(all == w);

  // A rank may stay out of a split; a child can be split again.
  std::unique_ptr<Communicator> some = world->split(me == w - 1 ? -1 : 0, me);
  CHECK((some == nullptr) == (me == w - 1));
  if (some) {
    CHECK(some->size() == w - 1);
    CHECK(some->rank() == me);
    std::unique_ptr<Communicator> single = some->split(some->rank(), 0);
    REQUIRE(single != nullptr);
    CHECK(single->size() == 1);
    float f = 2.5f;
    single->all_reduce(&f, &f, 1, DType::kFloat32, ReduceOp::kAvg, host_stream());
    CHECK(f == 2.5f);
  }
}

TEST_CASE("counters follow the ring model per operation kind") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  const double wd = w;
  const int root = w - 1;
  std::vector<float> big(100 * static_cast<size_t>(w)), part(100);
  world->all_reduce(big.data(), big.data(), big.size(), DType::kFloat32, ReduceOp::kSum,
                    host_stream());
  world->reduce_scatter(big.data(), part.data(), 100, DType::kFloat32, ReduceOp::kSum,
                        host_stream());
  world->all_gather(part.data(), big.data(), 100, DType::kFloat32, host_stream());
  std::vector<bf16> h(64);
  world->broadcast(h.data(), h.data(), 64, DType::kBFloat16, root, host_stream());
  world->barrier(host_stream());

  const CommCounters& c = world->counters();
  const double bytes = 400.0 * wd;  // the whole fp32 buffer
  CHECK(c[CollectiveKind::kAllReduce].calls == 1);
  CHECK(c[CollectiveKind::kAllReduce].elements == 100 * static_cast<uint64_t>(w));
  CHECK(c[CollectiveKind::kAllReduce].bytes_sent == doctest::Approx(2.0 * (wd - 1) / wd * bytes));
  CHECK(c[CollectiveKind::kReduceScatter].elements == 100 * static_cast<uint64_t>(w));
  CHECK(c[CollectiveKind::kReduceScatter].bytes_sent == (wd - 1) / wd * bytes);
  CHECK(c[CollectiveKind::kAllGather].bytes_received == (wd - 1) / wd * bytes);
  const bool is_root = world->rank() == root;
  const double bcast = w > 1 ? 128.0 : 0.0;
  CHECK(c[CollectiveKind::kBroadcast].bytes_sent == (is_root ? bcast : 0.0));
  CHECK(c[CollectiveKind::kBroadcast].bytes_received == (is_root ? 0.0 : bcast));
  CHECK(c[CollectiveKind::kBarrier].calls == 1);
  CHECK(world->sequence() == 5);
  if (w == 1) CHECK(c.total_bytes_sent() == 0);  // one rank moves nothing
  world->reset_counters();
  CHECK(world->counters().total_bytes_received() == 0);
}

TEST_CASE("an MpiCommunicator owns an error-returning duplicate of the communicator it is given") {
  MpiCommunicator comm(MPI_COMM_WORLD, test::mpi_test_options());
  int result = MPI_UNEQUAL;
  REQUIRE(MPI_Comm_compare(comm.native(), MPI_COMM_WORLD, &result) == MPI_SUCCESS);
  CHECK(result == MPI_CONGRUENT);  // same ranks, but its own traffic
  MPI_Errhandler handler = MPI_ERRHANDLER_NULL;
  REQUIRE(MPI_Comm_get_errhandler(comm.native(), &handler) == MPI_SUCCESS);
  CHECK(handler == MPI_ERRORS_RETURN);
  MPI_Errhandler_free(&handler);
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  CHECK(comm.rank() == world_rank);
  // Group calls run as issued.
  comm.group_start();
  int64_t x = 1;
  comm.all_reduce(&x, &x, 1, DType::kInt64, ReduceOp::kSum, host_stream());
  comm.group_end();
  CHECK(x == comm.size());
}

TEST_CASE("bad arguments get clear errors") {
  CHECK_THROWS_WITH_AS(MpiCommunicator(MPI_COMM_NULL), doctest::Contains("MPI_COMM_NULL"), Error);
  CommOptions zero;
  zero.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(make_mpi_world(zero), doctest::Contains("timeout must be positive"), Error);
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  int32_t i = 0;
  CHECK_THROWS_WITH_AS(world->all_reduce(&i, &i, 1, DType::kInt32, ReduceOp::kAvg, host_stream()),
                       doctest::Contains("avg is defined for floating types only"), Error);
  CHECK(world->sequence() == 0);  // refused before any rank waited
  world->barrier(host_stream());
  CHECK_FALSE(world->aborted());
}

TEST_CASE("a second MpiEnvironment leaves MPI to the first") {
  {
    MpiEnvironment inner;
    CHECK_FALSE(inner.initialized_here());
    int size = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    CHECK(inner.size() == size);
  }
  int finalized = 1;
  MPI_Finalized(&finalized);
  CHECK_FALSE(finalized);
  CHECK(MpiEnvironment::abort_reason().empty());
}
