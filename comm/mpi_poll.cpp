#include "zest/comm/mpi_poll.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "zest/core/mpi_check.h"

namespace zest::mpi {

// Sleeping between polls leaves the core to the ranks this one waits for
// (often more ranks than cores on a test machine); the pause grows so that a
// long wait costs little, and stays short so that a finished operation is
// seen soon.
bool poll_until(MPI_Request& request, const Deadline& deadline) {
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    int done = 0;
    ZEST_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    if (done) return true;
    if (deadline.passed()) return false;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace zest::mpi
