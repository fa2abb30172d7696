// A rank that never arrives, ranks that call different collectives, or a rank
// whose collective fails part-way, end in a CommError on every rank naming the
// operation, its number and the ranks, within the timeout (or at once, for a
// divergence or a failure); never a hang.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <string>
#include <thread>

#include "zest/comm/inprocess_comm.h"

using namespace zest;
using Clock = std::chrono::steady_clock;

namespace {

CommOptions with_timeout(int ms) {
  CommOptions o;
  o.timeout = std::chrono::milliseconds(ms);
  return o;
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

TEST_CASE("a rank that never arrives times out the others, naming it") {
  std::vector<std::string> errors(3);
  std::vector<double> waited(3);
  std::vector<char> aborted_after(3);  // not vector<bool>: ranks write their own element at once
  std::atomic<int> done{0};
  run_inprocess(3, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    comm.barrier(stream);
    if (comm.rank() == 1) {
      // Skips the all_reduce below, busy elsewhere until the others are done
      // (a rank that returned would be named as gone at once instead).
      while (done.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      return;
    }
    float x[10] = {};
    const auto start = Clock::now();
    try {
      comm.all_reduce(x, x, 10, DType::kFloat32, ReduceOp::kSum, stream);
    } catch (const CommError& e) {
      CHECK(e.reason() == CommError::Reason::kTimeout);
      errors[comm.rank()] = e.message();
    }
    waited[comm.rank()] = seconds_since(start);
    aborted_after[comm.rank()] = comm.aborted();
    // Every later call fails at once with the same reason.
    CHECK_THROWS_WITH_AS(comm.barrier(stream), doctest::Contains("aborted by an earlier failure"),
                         CommError);
    ++done;
  }, Device::host(), with_timeout(300));
  for (int r : {0, 2}) {
    CAPTURE(r);
    CHECK(errors[r].find("in-process all_reduce #2 (10 x fp32, sum) timed out after 300 ms") !=
          std::string::npos);
    CHECK(errors[r].find("ranks 0,2 arrived, rank 1 did not; rank 1's last call was barrier #1") !=
          std::string::npos);
    CHECK(waited[r] >= 0.25);
    CHECK(waited[r] < 5.0);
    CHECK(aborted_after[r]);
  }
}

TEST_CASE("ranks calling different collectives all fail at once, naming both calls") {
  std::vector<std::string> errors(3);
  std::vector<double> waited(3);
  run_inprocess(3, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    float x[8] = {};
    const auto start = Clock::now();
    try {
      if (comm.rank() == 1) {
        float all[24];
        comm.all_gather(x, all, 8, DType::kFloat32, stream);
      } else {
        comm.all_reduce(x, x, 8, DType::kFloat32, ReduceOp::kSum, stream);
      }
    } catch (const CommError& e) {
      CHECK((e.reason() == CommError::Reason::kMismatch || e.reason() == CommError::Reason::kAborted));
      errors[comm.rank()] = e.message();
    }
    waited[comm.rank()] = seconds_since(start);
  }, Device::host(), with_timeout(30000));
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(errors[r].find("called different collectives") != std::string::npos);
    CHECK(errors[r].find("rank 1 called all_gather #1 (8 x fp32)") != std::string::npos);
    CHECK(errors[r].find("called all_reduce #1 (8 x fp32, sum)") != std::string::npos);
    CHECK(waited[r] < 5.0);  // reported at once, not after the 30 s timeout
  }
}

TEST_CASE("different counts, roots or a skipped call are divergences too") {
  auto first_error = [](const std::function<void(Communicator&, const Stream&)>& body) {
    std::string message;
    std::mutex m;
    run_inprocess(2, [&](Communicator& comm) {
      OwnedStream stream(Device::host());
      try {
        body(comm, stream);
      } catch (const CommError& e) {
        std::lock_guard<std::mutex> lock(m);
        if (message.empty()) message = e.message();
      }
    }, Device::host(), with_timeout(10000));
    return message;
  };
  const std::string counts = first_error([](Communicator& comm, const Stream& s) {
    float x[5] = {};
    comm.all_reduce(x, x, comm.rank() == 0 ? 5 : 4, DType::kFloat32, ReduceOp::kSum, s);
  });
  CHECK(counts.find("all_reduce #1 (5 x fp32, sum)") != std::string::npos);
  CHECK(counts.find("all_reduce #1 (4 x fp32, sum)") != std::string::npos);

  const std::string roots = first_error([](Communicator& comm, const Stream& s) {
    int32_t v = 0;
    comm.broadcast(&v, &v, 1, DType::kInt32, comm.rank(), s);
  });
  CHECK(roots.find("broadcast #1 (1 x int32, root 0)") != std::string::npos);
  CHECK(roots.find("broadcast #1 (1 x int32, root 1)") != std::string::npos);

  const std::string skipped = first_error([](Communicator& comm, const Stream& s) {
    if (comm.rank() == 0) comm.barrier(s);
    float x = 0;
    comm.all_reduce(&x, &x, 1, DType::kFloat32, ReduceOp::kSum, s);
  });
  CHECK(skipped.find("rank 0 called barrier #1") != std::string::npos);
  CHECK(skipped.find("rank 1 called all_reduce #1 (1 x fp32, sum)") != std::string::npos);
}

TEST_CASE("a call refused for bad arguments does not shift the numbering") {
  run_inprocess(2, [](Communicator& comm) {
    OwnedStream stream(Device::host());
    float buf[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    if (comm.rank() == 0) {
      CHECK_THROWS_WITH_AS(comm.all_reduce(buf, buf + 2, 4, DType::kFloat32, ReduceOp::kSum, stream),
                           doctest::Contains("overlap without being the same buffer"), Error);
      CHECK(comm.sequence() == 0);
      CHECK_FALSE(comm.aborted());
    }
    comm.all_reduce(buf, buf, 8, DType::kFloat32, ReduceOp::kSum, stream);
    CHECK(buf[7] == 2.0f);
    CHECK(comm.sequence() == 1);
  });
}

TEST_CASE("a rank whose collective fails part-way aborts the others at once, naming it") {
  // An element type that no reduction knows: the enum's storage admits it and
  // no argument check looks at its range, so it fails only inside the
  // reduction, a stand-in for any failure there (a dtype and op pair a kernel
  // lacks, bad_alloc, a CUDA error). One element over two ranks: rank 0
  // reduces it, rank 1's chunk is empty, so rank 1 goes on to wait for rank 0
  // to leave the collective.
  const DType unknown = static_cast<DType>(42);
  std::vector<std::string> errors(2);
  std::vector<char> comm_error(2);  // not vector<bool>: one word shared by the ranks
  std::vector<CommError::Reason> reasons(2, CommError::Reason::kTimeout);
  std::vector<double> waited(2);
  std::vector<char> aborted_after(2);
  std::latch both_done(2);
  run_inprocess(2, [&](Communicator& comm) {
    OwnedStream stream(Device::host());
    const size_t r = static_cast<size_t>(comm.rank());
    float x = 1.0f;
    const auto start = Clock::now();
    try {
      comm.all_reduce(&x, &x, 1, unknown, ReduceOp::kSum, stream);
    } catch (const CommError& e) {
      comm_error[r] = true;
      reasons[r] = e.reason();
      errors[r] = e.message();
    } catch (const Error& e) {
      errors[r] = e.message();
    }
    waited[r] = seconds_since(start);
    aborted_after[r] = comm.aborted();
    // Only once both are out: a later call of rank 0 must not be what ends
    // rank 1's wait.
    both_done.arrive_and_wait();
    CHECK_THROWS_WITH_AS(comm.barrier(stream), doctest::Contains("aborted by an earlier failure"),
                         CommError);
  }, Device::host(), with_timeout(20000));
  // Rank 0 gets its own error, as thrown.
  CHECK_FALSE(comm_error[0]);
  CHECK_MESSAGE(errors[0].find("unknown DType value 42") != std::string::npos, errors[0]);
  CHECK(aborted_after[0]);
  // Rank 1 learns of it at once, not after the 20 s timeout.
  CHECK(comm_error[1]);
  CHECK(reasons[1] == CommError::Reason::kBackend);
  CHECK_MESSAGE(errors[1].find("in-process all_reduce #1 (1 x dtype 42, sum) failed on rank 0: ") !=
                    std::string::npos,
                errors[1]);
  CHECK(errors[1].find("unknown DType value 42") != std::string::npos);
  CHECK(waited[1] < 5.0);
  CHECK(aborted_after[1]);
}
