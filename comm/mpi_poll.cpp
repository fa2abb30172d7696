#include "zest/comm/mpi_poll.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "zest/core/mpi_check.h"
#include "zest/core/spin_wait.h"

namespace zest::mpi {

// Spinning first: a small collective finishes within microseconds of the
// last rank's call, far less than one sleep. Then sleeping leaves the core
// to the ranks this one waits for (often more ranks than cores on a test
// machine); the pause grows so that a long wait costs little, and stays
// short so that a finished operation is seen soon.
bool poll_until(MPI_Request& request, const Deadline& deadline, std::chrono::microseconds spin,
                const std::function<bool()>& between) {
  const auto test = [&] {
    int done = 0;
    ZEST_MPI_CHECK(MPI_Test(&request, &done, MPI_STATUS_IGNORE));
    return done != 0;
  };
  if (spin_until(std::min<std::chrono::microseconds>(spin, deadline.remaining_us()), test)) return true;
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    if (deadline.passed()) return false;
    std::this_thread::sleep_for(std::min(pause, deadline.remaining_us()));
    if (test()) return true;
    if (between && between()) return false;
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

}  // namespace zest::mpi
