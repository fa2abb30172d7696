// Waiting for non-blocking MPI operations with a deadline: how the MPI
// backend and init_distributed's MPI rendezvous turn a rank that never
// arrives into a timeout instead of a hang. Internal (includes <mpi.h>).
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>
#include <span>

#include "zest/core/deadline.h"

namespace zest::mpi {

// How a wait polls: for `spin` it calls MPI_Test back to back (each call
// also makes progress on the operation); then for `busy` more it keeps
// testing, calling `between` about every millisecond; then it sleeps between
// tests,
// 10 us doubling to 1 ms, calling `between` after each. Never past the
// deadline. `between` never runs while spinning, so a quick operation never
// calls it; when it returns true the wait is given up before the deadline.
struct PollPlan {
  std::chrono::microseconds spin{50};
  std::chrono::microseconds busy{0};
  std::function<bool()> between;
};

// Polls `requests` until all complete (true; their statuses in `statuses`
// unless it is MPI_STATUSES_IGNORE) or the wait is given up (false). MPI
// cannot cancel a collective: on false the operations stay pending and may
// still use their buffers, which the caller must then keep alive.
bool poll_until(std::span<MPI_Request> requests, MPI_Status* statuses, const Deadline& deadline,
                const PollPlan& plan);

// One request, spinning for `spin`, then sleeping.
bool poll_until(MPI_Request& request, const Deadline& deadline,
                std::chrono::microseconds spin = std::chrono::microseconds(50),
                const std::function<bool()>& between = nullptr);

}  // namespace zest::mpi
