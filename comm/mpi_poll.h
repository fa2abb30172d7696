// Waiting for a non-blocking MPI operation with a deadline: how the MPI
// backend and init_distributed's MPI rendezvous turn a rank that never
// arrives into a timeout instead of a hang. Internal (includes <mpi.h>).
#pragma once

#include <mpi.h>

#include <chrono>
#include <functional>

#include "zest/core/deadline.h"

namespace zest::mpi {

// Polls `request` until it completes (true) or `deadline` passes (false).
// For `spin` it calls MPI_Test back to back (each call also makes progress
// on the operation), then sleeps between calls, 10 us doubling to 1 ms,
// never past the deadline. MPI cannot cancel a collective: on false the
// operation stays pending and may still use its buffers, which the caller
// must then keep alive. `between`, when given, runs between the sleeping
// polls (never while spinning, so a quick operation never calls it); when it
// returns true the wait is given up (false) before the deadline.
bool poll_until(MPI_Request& request, const Deadline& deadline,
                std::chrono::microseconds spin = std::chrono::microseconds(50),
                const std::function<bool()>& between = nullptr);

}  // namespace zest::mpi
