// Who is still there: the MPI backend's side channel, which names the rank
// a collective waits for and fails the others within seconds when a rank
// leaves. Internal (includes <mpi.h>).
//
// Note [the presence channel]: MPI says neither which ranks a pending
// collective still waits for nor that a peer has finalized, so the process
// keeps a duplicate of MPI_COMM_WORLD (made by make_mpi_world, collectively,
// with every process's host and pid) for three kinds of message:
//   - "leaving": sent to every process from MPI_Finalize (an attribute of
//     MPI_COMM_SELF, whose delete callback MPI runs first thing there), so
//     whatever the program does on its way out (return from main, exit(),
//     a static MpiEnvironment) the others learn it; a rank waiting for it
//     fails after a grace of 2 s (the call may have been its last, its part
//     on the way) and answers with
//   - "waiting for you": the leaving rank waits in MPI_Finalize's hook (5 s
//     at most) until the others leave too or one objects; then it says so
//     and ends the job with MPI_Abort (5 s later, so that the waiting ranks
//     report their own error first);
//   - "where are you": sent by a rank whose collective timed out to the
//     other members of its communicator;
//   - the answer: what the answering rank is waiting in.
// Only a rank that is waiting (past its spin, in a ZEST collective's poll
// loop) reads the channel, so a collective that completes at once never
// touches it. A rank that does not answer within a second is stopped, busy
// outside ZEST's collectives, or dead; one that answers with another call
// has diverged. Processes that never made a world communicator have no
// channel, and their errors say that the missing ranks are unknown.
#pragma once

#include <mpi.h>

#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zest/core/deadline.h"

namespace zest::mpi {

// Opens the channel (collective over MPI_COMM_WORLD) unless it is open;
// throws CommError (kTimeout) when not every process takes part by `deadline`.
void open_presence(const Deadline& deadline, std::chrono::microseconds spin);
bool presence_open();

// "world rank 3 on host node7, pid 4242", or "world rank 3" without a channel.
std::string describe_world_rank(int world_rank);

// The world ranks of `comm`'s members, in `comm`'s rank order.
std::vector<int> world_ranks_of(MPI_Comm comm);

// What this rank is waiting in, as its answer to the others says it.
struct WaitingIn {
  std::string_view what;  // "all_reduce #5 (10 x fp32, sum)"
  int comm_rank = 0;
  int comm_size = 0;
  bool moving_data = false;
};

// Reads the channel without blocking: answers the questions of other ranks
// with `me`, and records the ranks that left. Cheap when nothing came.
void serve_presence(const WaitingIn& me);

// The first of `members` (world ranks) known to have left, with how it
// left; nullopt when none has (or there is no channel).
struct Departure {
  int world_rank = -1;
  std::string how;
};
std::optional<Departure> departed_among(std::span<const int> members);

// Tells `world_rank`, which left, that this rank waits for it in `me`: it
// then ends the job (Note [the presence channel]).
void object_to_departure(int world_rank, const WaitingIn& me);

// Asks `members` (world ranks, this process's own skipped) what they wait
// in, serving the channel meanwhile as `me`, for at most `grace`: per
// member, its answer ("waiting in all_reduce #5 (...) as rank 2 of 4"), or
// nullopt when it gave none. Everything nullopt without a channel.
struct Answer {
  std::string what;
  int comm_size = 0;
  bool moving_data = false;
};
std::vector<std::optional<Answer>> ask_members(std::span<const int> members, const WaitingIn& me,
                                               std::chrono::milliseconds grace);

}  // namespace zest::mpi
