#include "zest/core/exit_deadline.h"

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <thread>
#include <utility>

namespace zest {

void exit_after(std::chrono::milliseconds wait, std::string why) {
  try {
    std::thread([wait, why = std::move(why)] {
      std::this_thread::sleep_for(wait);
      std::fprintf(stderr, "%s\n", why.c_str());
      std::fflush(stderr);
      std::_Exit(1);
    }).detach();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zest: could not start the thread that bounds the process's exit (%s); "
                 "it may hang if what should end it does not\n", e.what());
  }
}

void bound_mpi_abort() {
  exit_after(kMpiAbortWait,
             "MPI_Abort did not end this process within " +
                 std::to_string(kMpiAbortWait.count() / 1000) +
                 " s (mpirun or its daemon may be unreachable: a cut link, a dead host); exiting "
                 "without it");
}

}  // namespace zest
