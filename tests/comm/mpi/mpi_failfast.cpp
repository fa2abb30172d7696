// A rank that fails ends the whole job at once, saying why, while the others
// wait in a collective with the default 10-minute timeout; run by ctest under
// mpiexec -n 2 with a timeout of seconds, so a hang fails the test:
//
//   mpi_failfast uncaught   rank 1 throws out of main (the terminate handler
//                           MpiEnvironment installs)
//   mpi_failfast caught     main catches and calls MpiEnvironment::abort_job
//   mpi_failfast abort      rank 1 calls Communicator::abort
//   mpi_failfast unwind     the exception passes through the scope of the
//                           MpiEnvironment to a catch outside it
//
// Rank 0 prints FAILFAST-UNEXPECTED if its barrier ever returns or throws:
// it must be ended by the failing rank, not by its timeout.
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "zest/comm/mpi_comm.h"

using namespace zest;

namespace {

void wait_for_the_others(Communicator& comm) {
  try {
    comm.barrier(Stream::default_for(Device::host()));
    std::fprintf(stderr, "FAILFAST-UNEXPECTED: rank %d's barrier completed\n", comm.rank());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAILFAST-UNEXPECTED: rank %d: %s\n", comm.rank(), e.what());
  }
}

// Rank 1's part: fails as `mode` says, rank 0 waits.
void run(MpiEnvironment& mpi, const std::string& mode) {
  std::unique_ptr<Communicator> comm = make_mpi_world();  // the default timeout: 10 minutes
  comm->barrier(Stream::default_for(Device::host()));
  if (mpi.rank() != 1) {
    wait_for_the_others(*comm);
    return;
  }
  if (mode == "abort") comm->abort("the data loader of rank 1 died");
  throw std::runtime_error("the data loader of rank 1 died");
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "unwind") {
    try {
      MpiEnvironment mpi(&argc, &argv);
      run(mpi, mode);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "FAILFAST-UNEXPECTED: the environment let the exception through: %s\n",
                   e.what());
    }
    return 1;
  }
  MpiEnvironment mpi(&argc, &argv);
  if (mode == "uncaught" || mode == "abort") {
    run(mpi, mode);
    return 1;
  }
  try {
    run(mpi, mode);
  } catch (const std::exception& e) {
    MpiEnvironment::abort_job(fmt::format("mpi_failfast: {}", e.what()));
  }
  return 1;
}
