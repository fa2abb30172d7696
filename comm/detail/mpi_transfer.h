// One step of a large collective's data phase as point-to-point messages
// between every pair of ranks. Internal (includes <mpi.h>).
//
// Note [the data phase in point-to-point messages]: once the ranks agreed on
// a call (Note [one exchange per collective] in mpi_exchange.h), its data
// moves as non-blocking sends and receives on the caller's buffers, polled
// like every other wait (so a rank that stalls mid-transfer still times the
// others out, naming it), rather than as MPI's non-blocking collectives:
// Open MPI 4.1 runs those through libnbc, whose schedules took 2.3-4.5x the
// time of the blocking MPI_Allgather at 64 KiB-1 MiB on 2 ranks under the
// default single-copy transport, where the same bytes as plain sends and
// receives took the blocking call's time. The all-to-all steps (every rank
// sends to every other) move what MPI's pairwise and linear algorithms move;
// broadcast is a binomial tree of such steps, each rank in at most one
// message per step.
//
// No data message goes out before the agreement is complete, though that
// would save a round trip: a rank that made another call would send
// messages that do not fit the others' receives, and Open MPI 4.1's
// single-copy transport then corrupted the receiver's heap (mpi_fault
// large_count crashed a rank) instead of failing the receive.
#pragma once

#include <mpi.h>

#include <functional>
#include <span>
#include <vector>

namespace zest::mpi {

// `count` elements of the step's MPI type at `data`; count 0 for none.
struct Block {
  const void* data = nullptr;
  int count = 0;
};

// Posts, for every peer, a receive into recv_from(peer) and a send of
// send_to(peer) (empty blocks are skipped: the peer skips the matching one),
// all receives first; each rank starts with the rank after it, so that the
// ranks do not all send to rank 0 first. `requests` holds them; the returned
// span completes when the step is done.
std::span<MPI_Request> start_transfer(std::vector<MPI_Request>& requests, MPI_Comm comm, int rank, int size,
                                      MPI_Datatype type, const std::function<Block(int peer)>& send_to,
                                      const std::function<Block(int peer)>& recv_from);

}  // namespace zest::mpi
