// Point-to-point transfers across processes: the in-process checks (exact
// values, grouped rings, order per pair), the counters, and a device mesh
// over the MPI world whose groups are checked by all-reducing their
// members' rank bits. The failures are mpi_fault's and mpi_departure's p2p
// modes (they end the job).
#include <doctest/doctest.h>

#include <vector>

#include "comm/mpi/mpi_test_util.h"
#include "comm/p2p_conformance.h"
#include "zest/comm/mpi_comm.h"
#include "zest/mesh/device_mesh.h"

using namespace zest;
using test::host_stream;

TEST_CASE("MPI send and recv move every dtype exactly, in rings that start together") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  test::check_p2p_transfers(*world, host_stream());
  // And on a sub-communicator: the odd and the even ranks.
  std::unique_ptr<Communicator> half = world->split(world->rank() % 2, world->rank());
  test::check_p2p_transfers(*half, host_stream());
}

TEST_CASE("MPI transfers are counted exactly, carried or not") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  if (world->size() == 1) return;
  const int next = (world->rank() + 1) % world->size();
  const int prev = (world->rank() + world->size() - 1) % world->size();
  for (const size_t n : {size_t{10}, size_t{10000}}) {  // on the description message, and after it
    CAPTURE(n);
    world->reset_counters();
    std::vector<float> out(n, 1.0f), in(n);
    const P2POp ops[] = {P2POp::send(out.data(), n, DType::kFloat32, next),
                         P2POp::recv(in.data(), n, DType::kFloat32, prev)};
    world->send_recv(ops, host_stream());
    const CommCounters& c = world->counters();
    CHECK(c[CollectiveKind::kSend].calls == 1);
    CHECK(c[CollectiveKind::kSend].bytes_sent == 4.0 * static_cast<double>(n));
    CHECK(c[CollectiveKind::kRecv].bytes_received == 4.0 * static_cast<double>(n));
    CHECK(world->sequence() == 0);
    CHECK(in == out);
  }
}

TEST_CASE("a device mesh over the MPI world holds exactly its groups") {
  std::unique_ptr<Communicator> world = make_mpi_world(test::mpi_test_options());
  const int w = world->size();
  const int r = world->rank();
  for (int tp = 1; tp <= w; tp *= 2) {
    for (int pp = 1; tp * pp <= w; pp *= 2) {
      if (w % (tp * pp) != 0) continue;
      const MeshShape s{w / (tp * pp), tp, pp};
      CAPTURE(s.str());
      DeviceMesh mesh(*world, s);
      const auto check = [&](Communicator& c, const std::vector<int>& want) {
        REQUIRE(c.size() == static_cast<int>(want.size()));
        int64_t bits = int64_t{1} << r, expect = 0;
        for (int m : want) expect |= int64_t{1} << m;
        c.all_reduce(&bits, &bits, 1, DType::kInt64, ReduceOp::kSum, host_stream());
        CHECK(bits == expect);
      };
      check(mesh.tp(), tp_group_ranks(s, r));
      check(mesh.dp(), dp_group_ranks(s, r));
      check(mesh.pp(), pp_group_ranks(s, r));
      check(mesh.model_parallel(), model_parallel_group_ranks(s, r));
      // Activations down the pipeline and gradients back, as a schedule
      // moves them: stage s to s + 1 at once with s + 1 to s.
      Communicator& pipe = mesh.pp();
      if (pipe.size() > 1) {
        std::vector<P2POp> ops;
        float down_out = static_cast<float>(r), up_out = static_cast<float>(-r), down_in = 0, up_in = 0;
        if (!mesh.is_last_stage()) {
          ops.push_back(P2POp::send(&down_out, 1, DType::kFloat32, pipe.rank() + 1));
          ops.push_back(P2POp::recv(&up_in, 1, DType::kFloat32, pipe.rank() + 1));
        }
        if (!mesh.is_first_stage()) {
          ops.push_back(P2POp::recv(&down_in, 1, DType::kFloat32, pipe.rank() - 1));
          ops.push_back(P2POp::send(&up_out, 1, DType::kFloat32, pipe.rank() - 1));
        }
        pipe.send_recv(ops, host_stream());
        const std::vector<int> stages = pp_group_ranks(s, r);
        if (!mesh.is_last_stage()) CHECK(up_in == static_cast<float>(-stages[static_cast<size_t>(pipe.rank() + 1)]));
        if (!mesh.is_first_stage()) CHECK(down_in == static_cast<float>(stages[static_cast<size_t>(pipe.rank() - 1)]));
      }
    }
  }
}
