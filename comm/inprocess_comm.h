// Ranks as threads of one process: for tests, and for comparing stages and
// world sizes on one machine without a launcher. Buffers are host memory, or
// device memory of one GPU shared by all ranks.
//
//   // zest-example: run
//   zest::run_inprocess(4, [](zest::Communicator& comm) {
//     // the per-rank program, with comm.rank() in 0..3
//     float x = static_cast<float>(comm.rank());
//     comm.all_reduce(&x, &x, 1, zest::DType::kFloat32, zest::ReduceOp::kSum,
//                     zest::Stream::default_for(comm.device()));
//     ZEST_CHECK(x == 6.0f, "0 + 1 + 2 + 3 is 6, not {}", x);
//   });
//
// Every collective is a rendezvous of all ranks: each rank posts its buffers,
// and once all have arrived each rank reduces or copies its own chunk straight
// from the others' buffers, in rank order (so results are identical on every
// rank and deterministic run to run). A rank whose call differs from one
// already posted (operation, dtype, count, root) aborts the group at once, and
// a rank that does not arrive within the timeout aborts it then; either way
// every rank gets a CommError naming the operation, its number and the ranks.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "zest/comm/communicator.h"

namespace zest {

// The communicators of a new group of `world_size` ranks; communicator i is
// rank i and must be used by one thread at a time.
std::vector<std::unique_ptr<Communicator>> make_inprocess_group(int world_size,
                                                                Device device = Device::host(),
                                                                CommOptions options = {});

// Runs fn on `world_size` threads, one per rank, with the rank set for logs
// and errors (ScopedRank). A rank whose fn throws aborts the group
// (Communicator::abort), so the others' collectives fail at once saying
// "rank R failed: <its error>". Returns when all are done; if any threw,
// rethrows the failure that aborted the group (that rank's own exception,
// or the timeout or mismatch a rank detected), not the errors it caused on
// the others; failing that, the exception of the lowest rank that threw.
void run_inprocess(int world_size, const std::function<void(Communicator&)>& fn,
                   Device device = Device::host(), CommOptions options = {});

}  // namespace zest
