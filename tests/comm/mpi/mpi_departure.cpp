// A rank that leaves or stops is named to the others within seconds, run by
// ctest under mpiexec -n 3; rank 1 is the one that goes:
//
//   mpi_departure return   returns from main (its MpiEnvironment finalizes
//                          MPI) while the others wait in a barrier with the
//                          default 10-minute timeout
//   mpi_departure static   the same in a program whose MPI was started by
//                          init_distributed; the others wait in a split
//   mpi_departure exit     calls exit(3) in such a program (MPI is finalized
//                          by the static MpiEnvironment on the way out)
//   mpi_departure stop     stops itself with SIGSTOP; the others' barrier
//                          has a 3 s timeout (the ranks' harness continues
//                          it once they reported)
//   mpi_departure elsewhere  waits in a barrier of another communicator
//                          while the others wait in the world's (3 s
//                          timeouts): each side names where the other is
//   mpi_departure p2p      returns from main while rank 0 waits in a recv
//                          from it and rank 2 in a send to it (the default
//                          timeout): both name it as their peer that left
//   mpi_departure kill     kills itself with SIGKILL: no ZEST code runs, and
//                          Open MPI's mpiexec ends the job, saying so; the
//                          others wait with the default timeout meanwhile
//
// Ranks 0 and 2 print "DEPART-REPORT: rank R after S s: <the CommError>",
// or "DEPART-UNEXPECTED: ..." when the call did not fail, failed otherwise,
// or failed later than the bound; then end, aborting the job (their
// communicator recorded the abort). ctest's timeout fails a job that waits.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include <mpi.h>

#include "zest/comm/mpi_comm.h"
#include "zest/core/mpi_check.h"
#include "zest/launch/bootstrap.h"

using namespace zest;

namespace {

const Stream& host() {
  static const Stream s = Stream::default_for(Device::host());
  return s;
}

// Runs the call that must fail, times it, says whether it failed as
// `expected` within `bound`.
template <typename Call>
void report(int rank, double bound_s, const std::string& expected, Call&& call) {
  const auto start = std::chrono::steady_clock::now();
  try {
    call();
    std::fprintf(stderr, "DEPART-UNEXPECTED: rank %d: the call did not fail\n", rank);
  } catch (const CommError& e) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const bool ok = s <= bound_s && e.message().find(expected) != std::string::npos;
    std::fprintf(stderr, "%s: rank %d after %.2f s (bound %.0f s): %s\n",
                 ok ? "DEPART-REPORT" : "DEPART-UNEXPECTED", rank, s, bound_s, e.message().c_str());
  }
  std::fflush(stderr);
}

const char kLeft[] = "rank 1 (world rank 1 on host ";
const char kFinalized[] = "finalized MPI (it returned from main, or called exit() or MPI_Finalize)";

int leave_return() {
  MpiEnvironment mpi;
  std::unique_ptr<Communicator> comm = make_mpi_world();  // the default timeout: 10 minutes
  comm->barrier(host());                                    // #1: every rank is here
  if (comm->rank() == 1) return 0;                          // finalizes MPI on the way out
  report(comm->rank(), 10, std::string(kLeft), [&] { comm->barrier(host()); });
  return 1;
}

int leave_p2p() {
  MpiEnvironment mpi;
  std::unique_ptr<Communicator> comm = make_mpi_world();  // the default timeout: 10 minutes
  comm->barrier(host());
  if (comm->rank() == 1) return 0;
  float x[16] = {};
  report(comm->rank(), 10, std::string("its peer ") + kLeft, [&] {
    if (comm->rank() == 0) {
      comm->recv(x, 16, DType::kFloat32, 1, host());
    } else {
      comm->send(x, 16, DType::kFloat32, 1, host());
    }
  });
  return 1;
}

int leave_static(bool by_exit) {
  std::unique_ptr<Communicator> comm = init_distributed(Device::host());
  comm->barrier(host());
  if (comm->rank() == 1) {
    if (by_exit) std::exit(3);
    return 0;
  }
  report(comm->rank(), 10, std::string(kFinalized), [&] { comm->split(0, comm->rank()); });
  return 1;  // the static MpiEnvironment ends the job with MPI_Abort
}

int stop() {
  MpiEnvironment mpi;
  CommOptions options;
  options.timeout = std::chrono::seconds(3);
  std::unique_ptr<Communicator> comm = make_mpi_world(options);
  // Ranks 0 and 2, to line up their reports; and rank 1's pid, to continue it.
  MPI_Comm others = MPI_COMM_NULL;
  ZEST_MPI_CHECK(MPI_Comm_split(MPI_COMM_WORLD, comm->rank() == 1 ? MPI_UNDEFINED : 0, 0, &others));
  int pid = static_cast<int>(::getpid());
  ZEST_MPI_CHECK(MPI_Bcast(&pid, 1, MPI_INT, 1, MPI_COMM_WORLD));
  comm->barrier(host());
  if (comm->rank() == 1) {
    ::raise(SIGSTOP);
    ::sleep(60);  // continued only for the job's abort to end it
    return 1;
  }
  report(comm->rank(), 3 + 3, kLeft, [&] { comm->barrier(host()); });
  ZEST_MPI_CHECK(MPI_Barrier(others));  // both reports are out
  if (comm->rank() == 0 && ::kill(pid, SIGCONT) != 0) std::perror("DEPART-UNEXPECTED: kill");
  return 1;  // the MpiEnvironment ends the job with MPI_Abort
}

}  // namespace

int elsewhere() {
  MpiEnvironment mpi;
  CommOptions options;
  options.timeout = std::chrono::seconds(3);
  std::unique_ptr<Communicator> world = make_mpi_world(options);
  std::unique_ptr<Communicator> other = make_mpi_world(options);
  world->barrier(host());  // #1
  if (world->rank() == 1) {
    report(1, 3 + 3, "rank 0 (world rank 0 on host ", [&] { other->barrier(host()); });
  } else {
    report(world->rank(), 3 + 3,
           "rank 1 (world rank 1 on host ", [&] { world->barrier(host()); });
  }
  // Every report out before the MpiEnvironments end the job.
  ZEST_MPI_CHECK(MPI_Barrier(MPI_COMM_WORLD));
  return 1;
}

int kill_self() {
  MpiEnvironment mpi;
  std::unique_ptr<Communicator> comm = make_mpi_world();
  comm->barrier(host());
  if (comm->rank() == 1) ::raise(SIGKILL);
  try {
    comm->barrier(host());
    std::fprintf(stderr, "DEPART-UNEXPECTED: rank %d's barrier completed\n", comm->rank());
  } catch (const CommError& e) {
    std::fprintf(stderr, "DEPART-UNEXPECTED: rank %d: %s\n", comm->rank(), e.what());
  }
  return 1;
}

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "kill") return kill_self();
  if (mode == "elsewhere") return elsewhere();
  if (mode == "return") return leave_return();
  if (mode == "p2p") return leave_p2p();
  if (mode == "static") return leave_static(false);
  if (mode == "exit") return leave_static(true);
  if (mode == "stop") return stop();
  std::fprintf(stderr,
               "DEPART-UNEXPECTED: unknown mode '%s'; use return, p2p, static, exit, stop, elsewhere "
               "or kill\n",
               mode.c_str());
  return 2;
}
