// Collectives on a host stream with its own thread (Note [issue order across
// threads] in comm/communicator.cpp): queued there, counted when issued, run
// in the order issued, with a call on any other stream waiting for them; a
// failure there aborts the communicator and is reported where the stream is
// waited for. Each case holds the streams' threads at a gate to see what has
// not run yet.
#include <doctest/doctest.h>

#include <chrono>
#include <numeric>
#include <thread>
#include <vector>

#include "core/stream_gate.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/host_queue.h"

using namespace zest;

namespace {

CommOptions short_timeout() {
  CommOptions o;
  o.timeout = std::chrono::seconds(20);
  return o;
}

}  // namespace

TEST_CASE("collectives on a host stream with its own thread run there, in the order issued") {
  for (int world : {2, 3}) {
    CAPTURE(world);
    run_inprocess(world, [&](Communicator& comm) {
      CHECK(comm.supports_host_streams());
      const int r = comm.rank();
      const auto n = static_cast<size_t>(world);
      OwnedStream queue(Device::host(), HostWork::kOwnThread);
      test::StreamGate gate;
      gate.hold(queue);

      // Integers: every sum is exact, whatever the order of addition.
      std::vector<int32_t> a(1000, r + 1);
      std::vector<int32_t> b(3000 * n);
      std::iota(b.begin(), b.end(), 1000 * r);
      std::vector<int32_t> part(3000);
      std::vector<int32_t> gathered(500 * n), mine(500, 7 * r);
      comm.all_reduce(a.data(), a.data(), a.size(), DType::kInt32, ReduceOp::kSum, queue);
      comm.reduce_scatter(b.data(), part.data(), part.size(), DType::kInt32, ReduceOp::kSum, queue);
      comm.all_gather(mine.data(), gathered.data(), mine.size(), DType::kInt32, queue);
      // Counted and numbered when issued; nothing has run.
      CHECK(comm.counters()[CollectiveKind::kAllReduce].calls == 1);
      CHECK(comm.counters()[CollectiveKind::kReduceScatter].calls == 1);
      CHECK(comm.sequence() == 3);
      CHECK(a[0] == r + 1);

      // A collective in this thread comes after the queued ones on every
      // rank: it waits for them, so they are complete when it returns. A
      // helper opens the gate while it waits.
      std::thread opener([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        gate.open();
      });
      int32_t one = 1;
      comm.all_reduce(&one, &one, 1, DType::kInt32, ReduceOp::kSum, Stream::default_for(Device::host()));
      opener.join();
      CHECK(one == world);
      const int32_t ranks_sum = world * (world + 1) / 2;
      CHECK(a == std::vector<int32_t>(1000, ranks_sum));
      for (size_t i = 0; i < part.size(); ++i) {
        // Element i of part r is element r * 3000 + i of every rank's b.
        const int64_t expected = static_cast<int64_t>(world) * (3000 * r + static_cast<int64_t>(i)) +
                                 1000LL * (world * (world - 1) / 2);
        REQUIRE(part[i] == expected);
      }
      for (size_t i = 0; i < gathered.size(); ++i) REQUIRE(gathered[i] == 7 * static_cast<int32_t>(i / 500));
      queue.get().synchronize();
    }, Device::host(), short_timeout());
  }
}

TEST_CASE("a collective that fails on a host stream's thread aborts the communicator and is reported where the stream is waited for") {
  run_inprocess(2, [&](Communicator& comm) {
    OwnedStream queue(Device::host(), HostWork::kOwnThread);
    // The ranks disagree on the count: a mismatch, met on the thread.
    std::vector<float> x(comm.rank() == 0 ? 10 : 20, 1.0f);
    comm.all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, queue);
    CHECK_THROWS_WITH_AS(queue.get().synchronize(), doctest::Contains("called different collectives"), CommError);
    CHECK(comm.aborted());
    // A call on another stream gets the queued call's failure first (it
    // waits for it), then the abort.
    const Stream here = Stream::default_for(Device::host());
    CHECK_THROWS_WITH_AS(comm.barrier(here), doctest::Contains("called different collectives"), CommError);
    CHECK_THROWS_WITH_AS(comm.barrier(here), doctest::Contains("aborted by an earlier failure"), CommError);
  }, Device::host(), short_timeout());
}

TEST_CASE("a call on another stream waits for a queued collective that fails, and gets its failure") {
  run_inprocess(2, [&](Communicator& comm) {
    OwnedStream queue(Device::host(), HostWork::kOwnThread);
    std::vector<float> x(comm.rank() == 0 ? 10 : 20, 1.0f);
    comm.all_reduce(x.data(), x.data(), x.size(), DType::kFloat32, ReduceOp::kSum, queue);
    float y = 1.0f;
    CHECK_THROWS_WITH_AS(
        comm.all_reduce(&y, &y, 1, DType::kFloat32, ReduceOp::kSum, Stream::default_for(Device::host())),
        doctest::Contains("called different collectives"), CommError);
    CHECK(comm.aborted());
  }, Device::host(), short_timeout());
}
