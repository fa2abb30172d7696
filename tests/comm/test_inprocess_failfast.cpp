// A rank that fails outside a collective (an exception in its training loop)
// ends the others' collectives at once, quoting its error, instead of leaving
// them to wait out the timeout; run_inprocess reports that failure, not the
// aborts it caused.
#include <doctest/doctest.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "zest/comm/inprocess_comm.h"

namespace test_inprocess_failfast {

using namespace zest;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// The default: long enough that a test passing by the timeout would show.
CommOptions ten_minutes() {
  CommOptions o;
  o.timeout = std::chrono::minutes(10);
  return o;
}

}  // namespace

TEST_CASE("a rank that throws between collectives fails the others at once, with its text") {
  std::vector<std::string> errors(3);
  std::vector<double> waited(3, -1.0);
  std::string shown;
  const auto start = Clock::now();
  try {
    run_inprocess(3, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      comm.barrier(stream);
      if (comm.rank() == 1) {
        // Late enough that the others are waiting inside the all_reduce.
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        throw std::runtime_error("loss is NaN at step 7");
      }
      float x[10] = {};
      const auto t = Clock::now();
      try {
        comm.all_reduce(x, x, 10, DType::kFloat32, ReduceOp::kSum, stream);
      } catch (const CommError& e) {
        waited[comm.rank()] = seconds_since(t);
        errors[comm.rank()] = e.message();
        CHECK(e.reason() == CommError::Reason::kAborted);
        // Later calls are refused at once with the same cause.
        CHECK_THROWS_WITH_AS(comm.barrier(stream),
                             doctest::Contains("rank 1 failed: loss is NaN at step 7"), CommError);
        throw;
      }
    }, Device::host(), ten_minutes());
  } catch (const std::runtime_error& e) {
    shown = e.what();
    // The original exception, of its own type, not a CommError.
    CHECK(dynamic_cast<const CommError*>(&e) == nullptr);
  }
  CHECK(shown == "loss is NaN at step 7");
  CHECK(seconds_since(start) < 5.0);
  for (int r : {0, 2}) {
    CAPTURE(r);
    CAPTURE(errors[r]);
    CHECK(errors[r].find(fmt::format("in-process all_reduce #2 (10 x fp32, sum) on rank {} ended: "
                                     "rank 1 failed: loss is NaN at step 7",
                                     r)) != std::string::npos);
    CHECK(waited[r] >= 0.0);
    CHECK(waited[r] < 2.0);
  }
}

TEST_CASE("a rank that throws before the others reach their collective fails them on arrival") {
  std::string shown;
  const auto start = Clock::now();
  std::vector<std::string> errors(2);
  try {
    run_inprocess(2, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      if (comm.rank() == 1) throw std::logic_error("bad batch");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      try {
        comm.barrier(stream);
      } catch (const CommError& e) {
        errors[0] = e.message();
        throw;
      }
    }, Device::host(), ten_minutes());
  } catch (const std::logic_error& e) {
    shown = e.what();
  }
  CHECK(shown == "bad batch");
  CHECK(errors[0].find("in-process barrier #1 on rank 0 ended: rank 1 failed: bad batch") !=
        std::string::npos);
  CHECK(seconds_since(start) < 5.0);
}

TEST_CASE("the failure reaches collectives of communicators split from the group") {
  std::vector<std::string> errors(4);
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(
      run_inprocess(4, [&](Communicator& comm) {
        OwnedStream stream(Device::host());
        std::unique_ptr<Communicator> half = comm.split(comm.rank() % 2, comm.rank());
        if (comm.rank() == 3) throw std::runtime_error("out of data");
        float x[4] = {};
        try {
          half->all_reduce(x, x, 4, DType::kFloat32, ReduceOp::kSum, stream);
          // Rank 1's partner is rank 3: the even half completes, then meets
          // the abort in the parent.
          comm.barrier(stream);
        } catch (const CommError& e) {
          errors[static_cast<size_t>(comm.rank())] = e.message();
          throw;
        } catch (...) {
          errors[static_cast<size_t>(comm.rank())] = "OTHER " + current_exception_text();
          throw;
        }
      }, Device::host(), ten_minutes()),
      "out of data", std::runtime_error);
  CHECK(seconds_since(start) < 5.0);
  for (int r : {0, 1, 2}) {
    CAPTURE(r);
    CAPTURE(errors[static_cast<size_t>(r)]);
    CHECK(errors[static_cast<size_t>(r)].find("rank 3 failed: out of data") != std::string::npos);
  }
}

TEST_CASE("Communicator::abort from a program's own threads ends the group's collectives") {
  auto comms = make_inprocess_group(2, Device::host(), ten_minutes());
  std::string error;
  double waited = -1.0;
  std::thread waiter([&] {
    OwnedStream stream(Device::host());
    const auto t = Clock::now();
    try {
      comms[0]->barrier(stream);
    } catch (const CommError& e) {
      error = e.message();
    }
    waited = seconds_since(t);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comms[1]->abort("reading shard 12 failed");
  waiter.join();
  CHECK(error.find("rank 1 failed: reading shard 12 failed") != std::string::npos);
  CHECK(waited < 2.0);
  CHECK(comms[1]->aborted());
  CHECK(comms[1]->abort_reason() == "rank 1 failed: reading shard 12 failed");
  OwnedStream stream(Device::host());
  CHECK_THROWS_WITH_AS(comms[1]->barrier(stream),
                       doctest::Contains("rank 1 failed: reading shard 12 failed"), CommError);
}

TEST_CASE("run_inprocess reports the timeout that started a failure, not what it caused") {
  // Rank 1 times out first (the origin); rank 0 arrives late, meets the
  // abort and throws an error of its own because of it. Rank 0 is the lower
  // rank, but the timeout is what is shown.
  CommOptions o;
  o.timeout = std::chrono::milliseconds(200);
  CHECK_THROWS_WITH_AS(
      run_inprocess(2, [&](Communicator& comm) {
        OwnedStream stream(Device::host());
        if (comm.rank() == 1) {
          comm.barrier(stream);
          return;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(600));
        try {
          comm.barrier(stream);
        } catch (const CommError&) {
          throw std::runtime_error("rank 0 gave up because of the abort");
        }
      }, Device::host(), o),
      doctest::Contains("timed out after 200 ms on rank 1"), CommError);
}

TEST_CASE("a rank whose function returns while the others still call collectives is named at once") {
  std::vector<std::string> errors(3);
  std::vector<double> waited(3, -1.0);
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(
      run_inprocess(3, [&](Communicator& comm) {
        OwnedStream stream(Device::host());
        comm.barrier(stream);
        if (comm.rank() == 1) return;  // a per-rank early exit, without an error
        // Late enough that rank 1 has usually left: either way, the call fails.
        std::this_thread::sleep_for(std::chrono::milliseconds(comm.rank() == 0 ? 0 : 100));
        const auto t = Clock::now();
        try {
          comm.barrier(stream);
        } catch (const CommError& e) {
          waited[static_cast<size_t>(comm.rank())] = seconds_since(t);
          errors[static_cast<size_t>(comm.rank())] = e.message();
          throw;
        }
      }, Device::host(), ten_minutes()),
      doctest::Contains("in-process barrier #2 on rank 0 ended: rank 1 left: its function "
                        "returned, so it calls no more collectives on this communicator"),
      CommError);
  CHECK(seconds_since(start) < 5.0);
  for (int r : {0, 2}) {
    CAPTURE(r);
    CAPTURE(errors[static_cast<size_t>(r)]);
    CHECK(errors[static_cast<size_t>(r)].find(fmt::format("in-process barrier #2 on rank {} ended: "
                                                          "rank 1 left",
                                                          r)) != std::string::npos);
    CHECK(waited[static_cast<size_t>(r)] >= 0.0);
    CHECK(waited[static_cast<size_t>(r)] < 2.0);
    MESSAGE("rank ", r, " was told that rank 1 left after ", waited[static_cast<size_t>(r)], " s");
  }
  // Ranks that finish at different times without calling anything more end
  // cleanly: the departures fail no collective.
  run_inprocess(3, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    comm.barrier(stream);
    std::this_thread::sleep_for(std::chrono::milliseconds(20 * comm.rank()));
  }, Device::host(), ten_minutes());
}

}  // namespace test_inprocess_failfast
