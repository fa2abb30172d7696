// Every collective of the in-process backend, bit for bit, for 1 to 4 ranks.
#include <doctest/doctest.h>

#include <atomic>
#include <set>

#include "comm/conformance.h"
#include "zest/comm/inprocess_comm.h"

using namespace zest;

TEST_CASE("in-process collectives are exact for every dtype, count and world size") {
  for (int w = 1; w <= 4; ++w) {
    CAPTURE(w);
    std::vector<uint64_t> digests(static_cast<size_t>(w));
    run_inprocess(w, [&](Communicator& comm) {
      CHECK(comm.backend_name() == "in-process");
      CHECK(comm.size() == w);
      OwnedStream stream(Device::host());
      digests[static_cast<size_t>(comm.rank())] = test::check_all_collectives(comm, stream);
    });
    // Every rank saw the same all_reduce/all_gather/broadcast results; the
    // reduce_scatter parts differ by rank, so only equality of rank 0 with a
    // second run is checked below.
    uint64_t again = 0;
    run_inprocess(w, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      const uint64_t d = test::check_all_collectives(comm, stream);
      if (comm.rank() == 0) again = d;
    });
    CHECK(again == digests[0]);
  }
}

TEST_CASE("fp16 and bf16 sums round once, not at every step") {
  // 1 + 4 x 2^-11: adding 2^-11 to 1 in fp16 rounds back to 1 each time, but
  // the exact sum 1 + 2^-9 is representable.
  run_inprocess(5, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    const float mine = comm.rank() == 0 ? 1.0f : 1.0f / 2048.0f;
    fp16 h(mine);
    comm.all_reduce(&h, &h, 1, DType::kFloat16, ReduceOp::kSum, stream);
    CHECK(static_cast<float>(h) == 1.0f + 1.0f / 512.0f);
    bf16 b(comm.rank() == 0 ? 1.0f : 1.0f / 256.0f);
    comm.all_reduce(&b, &b, 1, DType::kBFloat16, ReduceOp::kSum, stream);
    CHECK(static_cast<float>(b) == 1.0f + 4.0f / 256.0f);
  });
}

TEST_CASE("max propagates NaN, and integer sums wrap") {
  run_inprocess(3, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    float v[2] = {static_cast<float>(comm.rank()), comm.rank() == 1 ? NAN : 1.0f};
    comm.all_reduce(v, v, 2, DType::kFloat32, ReduceOp::kMax, stream);
    CHECK(v[0] == 2.0f);
    CHECK(std::isnan(v[1]));
    int32_t big = 2000000000;
    comm.all_reduce(&big, &big, 1, DType::kInt32, ReduceOp::kSum, stream);
    CHECK(big == static_cast<int32_t>(int64_t{6000000000} - (int64_t{1} << 32)));
    int64_t neg = -5 - comm.rank();
    comm.all_reduce(&neg, &neg, 1, DType::kInt64, ReduceOp::kMax, stream);
    CHECK(neg == -5);
  });
}

TEST_CASE("typed span forms check their sizes") {
  run_inprocess(2, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    std::vector<float> send(6, 1.0f), recv(3);
    comm.reduce_scatter(std::span<const float>(send), std::span<float>(recv), ReduceOp::kSum, stream);
    CHECK(recv == std::vector<float>{2.0f, 2.0f, 2.0f});
    std::vector<float> wrong(4);
    CHECK_THROWS_WITH_AS(comm.reduce_scatter(std::span<const float>(send), std::span<float>(wrong),
                                             ReduceOp::kSum, stream),
                         doctest::Contains("not 2 ranks x recv's 4"), Error);
    std::vector<bf16> part(2, bf16(float(comm.rank()))), all(4);
    comm.all_gather(std::span<const bf16>(part), std::span<bf16>(all), stream);
    CHECK(static_cast<float>(all[3]) == 1.0f);
  });
}
