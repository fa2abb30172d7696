// The doctest main of the MPI tests: every rank runs every test case (they
// are collective), rank 0 reports, and every rank exits with the same code so
// that mpiexec's says whether any rank failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "zest/comm/mpi_comm.h"
#include "zest/core/mpi_check.h"
#include "../../ran_tests.h"

int main(int argc, char** argv) {
  zest::MpiEnvironment mpi(&argc, &argv);
  doctest::Context context;
  context.applyCommandLine(argc, argv);
  // The other ranks print their failures only, so the log is not N copies
  // of rank 0's.
  if (mpi.rank() != 0) {
    context.setOption("minimal", true);
    context.setOption("no-colors", true);
  }
  const int rc = context.run();
  if (context.shouldExit()) return rc != 0 ? 1 : 0;
  const int failed = zest_test::fail_if_none_ran(rc) != 0 ? 1 : 0;
  int any_failed = 0;
  ZEST_MPI_CHECK(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
  if (mpi.rank() == 0 && any_failed && !failed) {
    std::fprintf(stderr, "rank 0 passed, but another rank failed: see its output above\n");
  }
  return any_failed;
}
