// Faults across processes, run by ctest under mpiexec -n 3:
//
//   mpi_fault timeout     rank 1 skips an all_reduce the others call
//   mpi_fault mismatch    rank 1 calls all_gather where the others call all_reduce
//   mpi_fault count       rank 1 calls the all_reduce with a different count
//   mpi_fault large       rank 1 calls it with a count too large for one
//                         exchange message, the others with a small one (Note
//                         [one exchange per collective] in comm/detail/mpi_exchange.h)
//   mpi_fault large_count rank 1 calls a large all_gather with one more
//                         element, rank 2 a large all_reduce: no data may
//                         move before the exchange shows it (their messages
//                         would not fit the others' receives)
//   mpi_fault broadcast   rank 1 calls a small broadcast with a different
//                         count: the root, which returns without waiting for
//                         the others (Note [the broadcast root does not wait]
//                         in comm/detail/mpi_exchange.h), fails at its next call
//   mpi_fault broadcast_roots rank 1 names itself the broadcast's root, the
//                         others rank 0: two roots, neither waiting
//   mpi_fault broadcast_last rank 1's count differs, and the broadcast is the
//                         root's last call: the root reports it when its
//                         communicator is destroyed
//   mpi_fault p2p_count   rank 0 sends 8 floats to rank 1, which receives 7
//   mpi_fault p2p_large   the same with 20000 and 20001 floats, past what
//                         the description message carries: no data moves
//                         before both sides compared
//   mpi_fault p2p_timeout rank 0 sends to rank 1, which never receives
//   mpi_fault create      rank 1 does not create a communicator the others create
//   mpi_fault rendezvous  rank 0 skips share_from_rank0 (init_distributed's
//                         rendezvous over MPI), in a program that started MPI
//                         itself
//
// Every rank prints the CommError it got as "FAULT-REPORT: ..." (ctest looks
// for the expected text there), or "FAULT-UNEXPECTED: ..." for anything
// else, then ends through MpiEnvironment's abort path, so the job exits
// non-zero whatever happened: the report is the verdict. The harness's own
// traffic (lining up, the verdict) is on a duplicate of the world made
// first, so that what a fault leaves pending on the world cannot meet it.
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <vector>
#include <string>

#include "zest/launch/bootstrap.h"
#include "zest/launch/launch_env.h"
#include "zest/comm/mpi_comm.h"
#include "zest/core/mpi_check.h"

using namespace zest;

namespace {

const char* reason_name(CommError::Reason r) {
  switch (r) {
    case CommError::Reason::kTimeout: return "timeout";
    case CommError::Reason::kMismatch: return "mismatch";
    case CommError::Reason::kAborted: return "aborted";
    case CommError::Reason::kBackend: return "backend";
  }
  return "unknown";
}

// The harness's communicator (see the top).
MPI_Comm control = MPI_COMM_NULL;

// Without a deadline: orders the steps of the ranks whatever the machine's
// load, where a sleep would only make that likely.
void line_up() { ZEST_MPI_CHECK(MPI_Barrier(control)); }

// Runs the call that must fail, prints what happened; true when it failed
// as `expected` says.
bool report(int rank, const std::function<void()>& call,
            const std::function<bool(const CommError&)>& expected) {
  try {
    call();
    std::fprintf(stderr, "FAULT-UNEXPECTED: rank %d: the call did not fail\n", rank);
    return false;
  } catch (const CommError& e) {
    const bool ok = expected(e);
    std::fprintf(stderr, "%s: rank %d (%s): %s\n", ok ? "FAULT-REPORT" : "FAULT-UNEXPECTED", rank,
                 reason_name(e.reason()), e.message().c_str());
    return ok;
  }
}

bool is_mismatch(const CommError& e) { return e.reason() == CommError::Reason::kMismatch; }

bool run(Communicator& comm, const std::string& mode) {
  const Stream stream = Stream::default_for(Device::host());
  const int rank = comm.rank();
  const bool odd_one = rank == 1;
  float x[24] = {};
  if (mode == "timeout") {
    if (!odd_one) {
      const bool ok = report(rank, [&] {
        comm.all_reduce(x, x, 10, DType::kFloat32, ReduceOp::kSum, stream);
      }, [](const CommError& e) {
        return e.reason() == CommError::Reason::kTimeout &&
               e.message().find("all_reduce #2 (10 x fp32, sum) timed out after 2000 ms") !=
                   std::string::npos;
      });
      line_up();
      return ok;
    }
    // Skips the all_reduce, comes back once the others gave up on it, and
    // calls the next collective, which meets what they left pending: a
    // mismatch, or a timeout if MPI does not complete their abandoned call.
    line_up();
    return report(rank, [&] { comm.barrier(stream); }, [](const CommError& e) {
      return e.reason() == CommError::Reason::kMismatch ||
             e.reason() == CommError::Reason::kTimeout;
    });
  }
  if (mode == "mismatch") {
    return report(rank, [&] {
      if (odd_one) {
        comm.all_gather(x, x + 8, 8, DType::kFloat32, stream);
      } else {
        comm.all_reduce(x, x, 8, DType::kFloat32, ReduceOp::kSum, stream);
      }
    }, is_mismatch);
  }
  if (mode == "count") {
    return report(rank, [&] {
      comm.all_reduce(x, x, odd_one ? 7 : 8, DType::kFloat32, ReduceOp::kSum, stream);
    }, is_mismatch);
  }
  if (mode == "large_count") {
    std::vector<float> in(20001), out(3 * 20001);
    return report(rank, [&] {
      if (rank == 2) {
        comm.all_reduce(in.data(), out.data(), 20000, DType::kFloat32, ReduceOp::kSum, stream);
      } else {
        comm.all_gather(in.data(), out.data(), odd_one ? 20001 : 20000, DType::kFloat32, stream);
      }
    }, is_mismatch);
  }
  if (mode == "broadcast" || mode == "broadcast_roots" || mode == "broadcast_last") {
    const int root = mode == "broadcast_roots" && odd_one ? 1 : 0;
    const size_t count = mode != "broadcast_roots" && odd_one ? 7 : 8;
    if (mode == "broadcast_last" && rank == 0) {
      // Returns: the root's check is owed until the communicator goes.
      comm.broadcast(x, x, count, DType::kFloat32, root, stream);
      return true;
    }
    return report(rank, [&] {
      comm.broadcast(x, x, count, DType::kFloat32, root, stream);
      // A root learns of the mismatch here, before this call's exchange.
      if (rank == root) comm.barrier(stream);
    }, is_mismatch);
  }
  if (mode == "large") {
    std::vector<float> big(20000);
    return report(rank, [&] {
      comm.all_reduce(big.data(), big.data(), odd_one ? big.size() : 8, DType::kFloat32, ReduceOp::kSum, stream);
    }, is_mismatch);
  }
  if (mode == "p2p_count" || mode == "p2p_large") {
    if (rank == 2) return true;  // not a party to the transfer
    const size_t n = mode == "p2p_count" ? 8 : 20000;
    std::vector<float> buf(n + 1);
    return report(rank, [&] {
      if (rank == 0) {
        comm.send(buf.data(), n, DType::kFloat32, 1, stream);
      } else {
        comm.recv(buf.data(), n - (mode == "p2p_count" ? 1 : -1), DType::kFloat32, 0, stream);
      }
    }, is_mismatch);
  }
  if (mode == "p2p_timeout") {
    if (rank != 0) {
      line_up();  // never receives; waits here, outside ZEST, until rank 0 gave up
      return true;
    }
    const bool ok = report(rank, [&] { comm.send(x, 8, DType::kFloat32, 1, stream); }, [](const CommError& e) {
      return e.reason() == CommError::Reason::kTimeout;
    });
    line_up();
    return ok;
  }
  std::fprintf(stderr,
               "FAULT-UNEXPECTED: unknown mode '%s'; use timeout, mismatch, count, large, large_count, broadcast, "
               "broadcast_roots, broadcast_last, p2p_count, p2p_large, p2p_timeout, create or rendezvous\n",
               mode.c_str());
  return false;
}

// Over a duplicate of the world, so that the creation the others leave
// pending does not meet the world's later collectives.
bool create(int rank, const CommOptions& options) {
  MPI_Comm parent = MPI_COMM_NULL;
  ZEST_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &parent));
  if (rank == 1) {
    ZEST_MPI_CHECK(MPI_Comm_free(&parent));
    return true;
  }
  // `parent` stays: MPI still holds the pending duplication on it.
  return report(rank, [&] { MpiCommunicator comm(parent, options); }, [](const CommError& e) {
    return e.reason() == CommError::Reason::kTimeout &&
           e.message().find("creating an MPI communicator (MPI_Comm_idup) timed out after "
                            "2000 ms") != std::string::npos;
  });
}

// The rendezvous that init_distributed runs under mpirun: an MPI_Ibcast from
// rank 0 over MPI_COMM_WORLD. MPI was started by main's MpiEnvironment, not by
// ZEST, so the abort that the timeout leaves behind (an MPI_Ibcast that MPI
// cannot cancel) must be recorded where that MpiEnvironment looks, or its
// MPI_Finalize would wait for the broadcast forever.
bool rendezvous(int rank, const CommOptions& options) {
  if (rank == 0) return true;  // the root never comes, so neither other rank can be served
  const LaunchEnv env = detect_launch_env();
  return report(rank, [&] { share_from_rank0(env, process_env(), "", options.timeout); },
                [](const CommError& e) {
                  const std::string recorded = MpiEnvironment::abort_reason();
                  if (recorded != e.message()) {
                    std::fprintf(stderr, "FAULT-UNEXPECTED: the abort was not recorded for "
                                         "MpiEnvironment (it has '%s')\n", recorded.c_str());
                    return false;
                  }
                  return e.reason() == CommError::Reason::kTimeout &&
                         e.message().find("MPI rendezvous (MPI_Ibcast on MPI_COMM_WORLD) timed "
                                          "out") != std::string::npos;
                });
}

}  // namespace

int main(int argc, char** argv) {
  MpiEnvironment mpi(&argc, &argv);
  ZEST_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &control));
  const std::string mode = argc > 1 ? argv[1] : "";
  CommOptions options;
  options.timeout = std::chrono::milliseconds(2000);
  int ok = 0;
  if (mode == "create") {
    ok = create(mpi.rank(), options) ? 1 : 0;
  } else if (mode == "rendezvous") {
    ok = rendezvous(mpi.rank(), options) ? 1 : 0;
  } else {
    std::unique_ptr<Communicator> comm = make_mpi_world(options);
    line_up();
    comm->barrier(Stream::default_for(Device::host()));  // #1, so the fault is in #2
    ok = run(*comm, mode) ? 1 : 0;
  }
  // Also lines up: every report is out before any rank ends the job.
  int all_ok = 0;
  ZEST_MPI_CHECK(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, control));
  if (mpi.rank() == 0) {
    std::fprintf(stderr, "%s\n",
                 all_ok ? "FAULT-VERDICT: every rank got the expected error"
                        : "FAULT-UNEXPECTED: some rank did not get the expected error");
  }
  // A rank whose own communicator did not fail (rank 1 of "create", rank 0
  // of "rendezvous") ends the same way: MPI_Finalize would wait for the
  // ranks that aborted, and Open MPI 4.1's mpiexec sometimes crashes while
  // ending an aborted job, which would leave this rank waiting with ctest's
  // output pipe open.
  if (MpiEnvironment::abort_reason().empty()) ZEST_MPI_CHECK(MPI_Abort(MPI_COMM_WORLD, 1));
  return all_ok ? 0 : 1;
}
