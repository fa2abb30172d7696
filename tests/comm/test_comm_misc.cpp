// Sub-communicators, byte counters, grouping and argument checks.
#include <doctest/doctest.h>

#include <mutex>

#include "zest/comm/inprocess_comm.h"

using namespace zest;

TEST_CASE("split makes groups by color, ordered by key") {
  run_inprocess(4, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    // Even and odd ranks, each group in reverse rank order.
    std::unique_ptr<Communicator> half = comm.split(comm.rank() % 2, -comm.rank());
    REQUIRE(half != nullptr);
    CHECK(half->size() == 2);
    CHECK(half->rank() == (comm.rank() < 2 ? 1 : 0));
    int32_t v = comm.rank();
    half->all_reduce(&v, &v, 1, DType::kInt32, ReduceOp::kSum, stream);
    CHECK(v == (comm.rank() % 2 == 0 ? 0 + 2 : 1 + 3));
    // The parent keeps working, and its numbering counts the split.
    CHECK(comm.sequence() == 1);
    int32_t all = 1;
    comm.all_reduce(&all, &all, 1, DType::kInt32, ReduceOp::kSum, stream);
    CHECK(all == 4);
    // A rank may stay out of a split; a child can be split again.
    std::unique_ptr<Communicator> some = comm.split(comm.rank() == 3 ? -1 : 0, comm.rank());
    CHECK((some == nullptr) == (comm.rank() == 3));
    if (some) {
      CHECK(some->size() == 3);
      std::unique_ptr<Communicator> single = some->split(some->rank(), 0);
      CHECK(single->size() == 1);
      float f = 2.5f;
      single->all_reduce(&f, &f, 1, DType::kFloat32, ReduceOp::kAvg, stream);
      CHECK(f == 2.5f);
    }
  });
}

TEST_CASE("counters follow the ring model per operation kind") {
  std::mutex m;
  std::vector<CommCounters> seen(4);
  run_inprocess(4, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    std::vector<float> big(400), part(100);
    comm.all_reduce(big.data(), big.data(), 400, DType::kFloat32, ReduceOp::kSum, stream);
    comm.reduce_scatter(big.data(), part.data(), 100, DType::kFloat32, ReduceOp::kSum, stream);
    comm.all_gather(part.data(), big.data(), 100, DType::kFloat32, stream);
    std::vector<bf16> h(64);
    comm.broadcast(h.data(), h.data(), 64, DType::kBFloat16, 2, stream);
    std::lock_guard<std::mutex> lock(m);
    seen[comm.rank()] = comm.counters();
  });
  for (int r = 0; r < 4; ++r) {
    const CommCounters& c = seen[r];
    CHECK(c[CollectiveKind::kAllReduce].calls == 1);
    CHECK(c[CollectiveKind::kAllReduce].elements == 400);
    CHECK(c[CollectiveKind::kAllReduce].bytes_sent == 2.0 * 3 / 4 * 1600);
    CHECK(c[CollectiveKind::kReduceScatter].elements == 400);
    CHECK(c[CollectiveKind::kReduceScatter].bytes_sent == 3 * 400);
    CHECK(c[CollectiveKind::kAllGather].bytes_received == 3 * 400);
    CHECK(c[CollectiveKind::kBroadcast].bytes_sent == (r == 2 ? 128 : 0));
    CHECK(c[CollectiveKind::kBroadcast].bytes_received == (r == 2 ? 0 : 128));
    CHECK(c.total_bytes_sent() == 2400 + 1200 + 1200 + (r == 2 ? 128 : 0));
  }
  run_inprocess(1, [](Communicator& comm) {
    float x = 1;
    comm.all_reduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum, Stream::default_for(Device::host()));
    CHECK(comm.counters()[CollectiveKind::kAllReduce].calls == 1);
    CHECK(comm.counters().total_bytes_sent() == 0);  // one rank moves nothing
  });
}

TEST_CASE("bad arguments get clear errors before any rank waits") {
  run_inprocess(2, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    int32_t i = 0;
    float f[4] = {};
    CHECK_THROWS_WITH_AS(comm.all_reduce(&i, &i, 1, DType::kInt32, ReduceOp::kAvg, stream),
                         doctest::Contains("avg is defined for floating types only"), Error);
    CHECK_THROWS_WITH_AS(comm.broadcast(f, f, 4, DType::kFloat32, 2, stream),
                         doctest::Contains("root 2 is not a rank of this communicator (0..1)"), Error);
    CHECK_THROWS_WITH_AS(comm.all_reduce(nullptr, f, 4, DType::kFloat32, ReduceOp::kSum, stream),
                         doctest::Contains("must not be null"), Error);
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(f, f + 1, 2, DType::kFloat32, ReduceOp::kSum, stream),
                         doctest::Contains("recv overlaps send"), Error);
    CHECK_THROWS_WITH_AS(comm.group_end(), doctest::Contains("without a matching group_start"), Error);
    CHECK(comm.sequence() == 0);
    // Grouped operations still complete; non-roots may pass no send buffer.
    comm.group_start();
    comm.group_start();
    float v = static_cast<float>(comm.rank() + 1);
    comm.all_reduce(&v, &v, 1, DType::kFloat32, ReduceOp::kMax, stream);
    comm.group_end();
    comm.group_end();
    CHECK(v == 2.0f);
    float got = 0;
    const float seven = 7;
    comm.broadcast(comm.rank() == 0 ? &seven : nullptr, &got, 1, DType::kFloat32, 0, stream);
    CHECK(got == 7.0f);
  });
  CHECK_THROWS_WITH_AS(make_inprocess_group(0), doctest::Contains("1 to 4096 ranks"), Error);
  CommOptions zero;
  zero.timeout = std::chrono::milliseconds(0);
  CHECK_THROWS_WITH_AS(make_inprocess_group(2, Device::host(), zero),
                       doctest::Contains("timeout must be positive"), Error);
}
