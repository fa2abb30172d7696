#include "zest/comm/detail/mpi_poll.h"

#include <algorithm>
#include <chrono>
#include <thread>

#include "zest/core/mpi_check.h"
#include "zest/core/spin_wait.h"

namespace zest::mpi {

// Spinning first: a small collective finishes within microseconds of the
// last rank's call, far less than one sleep. A large one moves its data only
// inside MPI_Test (Open MPI has no progress thread by default), a fragment
// or a rendezvous step per call, so its wait keeps testing without sleeping
// or yielding, as MPI's own blocking calls do: a sleep would stall the
// transfer, on this rank and on the peers waiting for its part of a step,
// and a yield on a loaded machine gives the core away for a whole time
// slice (a 1 MiB exchange between 2 ranks took 15-25x longer yielding
// between tests than testing back to back, at load average 7). Past that,
// sleeping leaves the core to the ranks this one waits for; the pause grows
// so that a long wait costs little, and stays short so that a finished
// operation is seen soon.
bool poll_until(std::span<MPI_Request> requests, MPI_Status* statuses, const Deadline& deadline,
                const PollPlan& plan) {
  const auto test = [&] {
    int done = 0;
    ZEST_MPI_CHECK(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, statuses));
    return done != 0;
  };
  if (spin_until(std::min<std::chrono::microseconds>(plan.spin, deadline.remaining_us()), test)) return true;
  using Clock = std::chrono::steady_clock;
  if (plan.busy.count() > 0) {
    const auto end = Clock::now() + std::min<std::chrono::microseconds>(plan.busy, deadline.remaining_us());
    auto next_between = Clock::now() + std::chrono::milliseconds(1);
    for (;;) {
      cpu_relax();
      if (test()) return true;
      const auto now = Clock::now();
      if (now >= end) break;
      if (now >= next_between) {
        if (plan.between && plan.between()) return false;
        next_between = now + std::chrono::milliseconds(1);
      }
    }
  }
  auto pause = std::chrono::microseconds(10);
  for (;;) {
    if (deadline.passed()) return false;
    std::this_thread::sleep_for(std::min(pause, deadline.remaining_us()));
    if (test()) return true;
    if (plan.between && plan.between()) return false;
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

bool poll_until(MPI_Request& request, const Deadline& deadline, std::chrono::microseconds spin,
                const std::function<bool()>& between) {
  return poll_until(std::span<MPI_Request>(&request, 1), MPI_STATUSES_IGNORE, deadline,
                    PollPlan{spin, std::chrono::microseconds(0), between});
}

}  // namespace zest::mpi
