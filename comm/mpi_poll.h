// Waiting for a non-blocking MPI operation with a deadline: how the MPI
// backend and init_distributed's MPI rendezvous turn a rank that never
// arrives into a timeout instead of a hang. Internal (includes <mpi.h>).
#pragma once

#include <mpi.h>

#include "zest/core/deadline.h"

namespace zest::mpi {

// Polls `request` until it completes (true) or `deadline` passes (false).
// MPI cannot cancel a collective: on false the operation stays pending and
// may still use its buffers, which the caller must then keep alive.
bool poll_until(MPI_Request& request, const Deadline& deadline);

}  // namespace zest::mpi
