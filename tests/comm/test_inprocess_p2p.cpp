// Point-to-point transfers on in-process ranks: exact values, grouped rings
// that would deadlock as lone sends, counters, and every failure named: a
// mismatch (both ranks and both calls), a peer that never comes (by the
// timeout), one that left or failed (at once); ranks that finished are no
// obstacle to the others' transfers.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "comm/p2p_conformance.h"
#include "zest/comm/inprocess_comm.h"

namespace test_inprocess_p2p {

using namespace zest;
using Clock = std::chrono::steady_clock;

namespace {

CommOptions with_timeout(int ms) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

TEST_CASE("send and recv move every dtype exactly, in rings that start together, on 2, 3 and 4 ranks") {
  for (const int w : {2, 3, 4}) {
    CAPTURE(w);
    run_inprocess(w, [](Communicator& comm) {
      OwnedStream stream(Device::host());
      test::check_p2p_transfers(comm, stream);
      // Collectives and transfers interleave on one communicator.
      int64_t x = comm.rank();
      comm.all_reduce(&x, &x, 1, DType::kInt64, ReduceOp::kSum, stream);
      CHECK(x == comm.size() * (comm.size() - 1) / 2);
    });
  }
}

TEST_CASE("transfers are counted exactly and take no number of the collectives' sequence") {
  run_inprocess(3, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    std::vector<float> out(100, 1.0f), in(100);
    const int next = (comm.rank() + 1) % 3, prev = (comm.rank() + 2) % 3;
    const P2POp ops[] = {P2POp::send(out.data(), 100, DType::kFloat32, next),
                         P2POp::recv(in.data(), 100, DType::kFloat32, prev)};
    comm.send_recv(ops, stream);
    comm.send_recv(ops, stream);
    CHECK(comm.sequence() == 0);
    const CommCounters& c = comm.counters();
    CHECK(c[CollectiveKind::kSend].calls == 2);
    CHECK(c[CollectiveKind::kSend].elements == 200);
    CHECK(c[CollectiveKind::kSend].bytes_sent == 800.0);
    CHECK(c[CollectiveKind::kSend].bytes_received == 0.0);
    CHECK(c[CollectiveKind::kRecv].calls == 2);
    CHECK(c[CollectiveKind::kRecv].bytes_received == 800.0);
    CHECK(c.total_bytes_sent() == 800.0);
    CHECK(c.total_bytes_received() == 800.0);
  });
}

TEST_CASE("a transfer whose sides disagree fails on both ranks, naming both calls") {
  struct Case {
    const char* what;
    size_t recv_count;
    DType recv_dtype;
    uint64_t recv_tag;
    const char* recv_desc;
  };
  const Case cases[] = {
      {"count", 4, DType::kFloat32, 0, "recv #1 (4 x fp32, from rank 0)"},
      {"dtype", 8, DType::kInt32, 0, "recv #1 (8 x int32, from rank 0)"},
      {"tag", 8, DType::kFloat32, 3, "recv #1 (8 x fp32, from rank 0, tag 3)"},
  };
  for (const Case& k : cases) {
    CAPTURE(k.what);
    std::vector<std::string> errors(3);
    const std::string expected = fmt::format(
        "in-process transfer mismatch: rank 0's send #1 (8 x fp32, to rank 1) meets rank 1's {}", k.recv_desc);
    CHECK_THROWS_WITH_AS(run_inprocess(3, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      std::vector<int64_t> buf(8);
      try {
        if (comm.rank() == 0) comm.send(buf.data(), 8, DType::kFloat32, 1, stream);
        if (comm.rank() == 1) comm.recv(buf.data(), k.recv_count, k.recv_dtype, 0, stream, k.recv_tag);
      } catch (const CommError& e) {
        CHECK(e.reason() == CommError::Reason::kMismatch);
        errors[static_cast<size_t>(comm.rank())] = e.message();
        // The communicator is aborted, as after a collective's mismatch.
        CHECK_THROWS_WITH_AS(comm.barrier(stream), doctest::Contains("aborted by an earlier failure"), CommError);
        throw;
      }
    }, Device::host(), with_timeout(60000)), doctest::Contains(expected.c_str()), CommError);
    CHECK(errors[0].find(expected) != std::string::npos);
    CHECK(errors[1].find(expected) != std::string::npos);
  }
}

TEST_CASE("a peer that never posts its side times the transfer out, naming it and what it does") {
  std::atomic<int> done{0};
  std::string error;
  const auto start = Clock::now();
  CHECK_THROWS_AS(run_inprocess(2, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    if (comm.rank() == 1) {
      while (done.load() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    float x[4] = {};
    try {
      comm.send(x, 4, DType::kFloat32, 1, stream);
    } catch (const CommError& e) {
      CHECK(e.reason() == CommError::Reason::kTimeout);
      error = e.message();
      done = 1;
      throw;
    }
  }, Device::host(), with_timeout(300)), CommError);
  CHECK(seconds_since(start) < 5.0);
  CAPTURE(error);
  CHECK(error.find("in-process send #1 (4 x fp32, to rank 1) timed out after 300 ms on rank 0: send #1 (4 x "
                   "fp32, to rank 1) (rank 1 did not receive it); rank 1's last transfer was none") !=
        std::string::npos);
}

TEST_CASE("a peer that left or failed is named at once, and finished ranks do not stop the others") {
  SUBCASE("left") {
    const auto start = Clock::now();
    CHECK_THROWS_WITH_AS(run_inprocess(2, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      if (comm.rank() == 1) return;
      float x[4] = {};
      comm.recv(x, 4, DType::kFloat32, 1, stream);
    }, Device::host(), with_timeout(600000)),
                         doctest::Contains("recv #1 (4 x fp32, from rank 1) on rank 0 ended: rank 1 left"), CommError);
    CHECK(seconds_since(start) < 5.0);
  }
  SUBCASE("failed") {
    CHECK_THROWS_WITH_AS(run_inprocess(2, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      if (comm.rank() == 1) throw std::runtime_error("stage 1 ran out of memory");
      float x[4] = {};
      comm.recv(x, 4, DType::kFloat32, 1, stream);
    }, Device::host(), with_timeout(600000)), doctest::Contains("stage 1 ran out of memory"), std::runtime_error);
  }
  SUBCASE("a pipeline's first stage returns while the later ones still exchange") {
    run_inprocess(3, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      float x = 0.0f;
      if (comm.rank() == 0) {
        x = 1.0f;
        comm.send(&x, 1, DType::kFloat32, 1, stream);
        return;
      }
      if (comm.rank() == 1) {
        comm.recv(&x, 1, DType::kFloat32, 0, stream);
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // rank 0 has left by now
        x += 1.0f;
        comm.send(&x, 1, DType::kFloat32, 2, stream);
        comm.recv(&x, 1, DType::kFloat32, 2, stream);
        CHECK(x == 3.0f);
        return;
      }
      comm.recv(&x, 1, DType::kFloat32, 1, stream);
      CHECK(x == 2.0f);
      x += 1.0f;
      comm.send(&x, 1, DType::kFloat32, 1, stream);
    }, Device::host(), with_timeout(600000));
  }
}

TEST_CASE("bad transfer arguments get clear errors and leave the communicator usable") {
  run_inprocess(2, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    float x[2] = {};
    CHECK_THROWS_WITH_AS(comm.send(x, 2, DType::kFloat32, 2, stream),
                         doctest::Contains("peer 2 is not another rank of this communicator of 2 ranks"), Error);
    CHECK_THROWS_WITH_AS(comm.send(x, 2, DType::kFloat32, comm.rank(), stream),
                         doctest::Contains("not this rank"), Error);
    CHECK_THROWS_WITH_AS(comm.recv(nullptr, 2, DType::kFloat32, 1 - comm.rank(), stream),
                         doctest::Contains("the buffer is null"), Error);
    const P2POp overlapping[] = {P2POp::recv(x, 2, DType::kFloat32, 1 - comm.rank()),
                                 P2POp::send(x + 1, 1, DType::kFloat32, 1 - comm.rank())};
    CHECK_THROWS_WITH_AS(comm.send_recv(overlapping, stream), doctest::Contains("overlaps"), Error);
    comm.group_start();
    CHECK_THROWS_WITH_AS(comm.send(x, 2, DType::kFloat32, 1 - comm.rank(), stream),
                         doctest::Contains("inside a group_start/group_end block"), Error);
    comm.group_end();
    // None of the refusals took a message number: this pair matches #1.
    if (comm.rank() == 0) {
      x[0] = 5.0f;
      comm.send(x, 2, DType::kFloat32, 1, stream);
    } else {
      comm.recv(x, 2, DType::kFloat32, 0, stream);
      CHECK(x[0] == 5.0f);
    }
    CHECK_FALSE(comm.aborted());
  });
}

}  // namespace test_inprocess_p2p
