// Builds without MPI: the MPI backend's entry points exist, so programs that
// choose their backend at run time link everywhere, and say how to get it.
#include "zest/comm/mpi_comm.h"

#include <cstdio>
#include <cstdlib>

namespace zest {
namespace {

[[noreturn]] void no_mpi(const char* what) {
  ZEST_FAIL("{}: this build of ZEST has no MPI backend; install an MPI (Debian: libopenmpi-dev "
            "openmpi-bin) and configure with -DZEST_MPI=ON, or use another backend",
            what);
}

}  // namespace

MpiEnvironment::MpiEnvironment(int* /*argc*/, char*** /*argv*/) { no_mpi("zest::MpiEnvironment"); }

MpiEnvironment::~MpiEnvironment() = default;

std::string MpiEnvironment::abort_reason() { return {}; }

// Without MPI there is no MPI operation to abandon, and nothing to end.
void MpiEnvironment::record_abort(const std::string& /*reason*/) {}

void MpiEnvironment::keep_until_exit(std::shared_ptr<void> /*buffers*/) {}

void MpiEnvironment::abort_job(std::string_view message) {
  std::fprintf(stderr, "%.*s\n", static_cast<int>(message.size()), message.data());
  std::fflush(stdout);
  std::fflush(stderr);
  std::exit(1);
}

std::unique_ptr<Communicator> make_mpi_world(CommOptions /*options*/) {
  no_mpi("zest::make_mpi_world");
}

}  // namespace zest
