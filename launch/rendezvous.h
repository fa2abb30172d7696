// What the rendezvous share: rank 0 hands a small blob (NCCL's 128-byte
// unique id) to every other rank before any communicator exists. Two ways:
//
//   tcp_rendezvous.h   over TCP at MASTER_ADDR:port: rank 0 listens, the
//                      others connect (retrying until rank 0 is up)
//   file_rendezvous.h  through a file on a filesystem every rank sees
//                      (ZEST_RENDEZVOUS_FILE)
//
// Both check that every rank was started for the same job (world size, and
// the job id where the launcher gives one), and every wait ends by a
// deadline: a rank that never shows up is a CommError (kTimeout) naming the
// kind of rendezvous, its address or path, this rank and how long it waited;
// ranks started for different jobs are a CommError (kMismatch). Bad input
// (an unresolvable host, a port outside 1..65535, a path that cannot be
// written) is a zest::Error at once, never a wait.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include "zest/core/deadline.h"

namespace zest {

// Who this rank is in a rendezvous, and how long it waits in all.
struct RendezvousMember {
  int rank = 0;
  int world_size = 1;
  // Names the run (LaunchEnv::job_id); empty when the launcher gives none.
  // Ranks with different non-empty ids never take each other's data.
  std::string job_id{};
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
};

// The largest blob a rendezvous carries: ids, not data.
inline constexpr size_t kMaxRendezvousBlob = 64 * 1024;

// The argument checks of every rendezvous, as a zest::Error that names the
// kind ("TCP", "file"): `me` is a rank of its world with a positive timeout,
// and `blob` is at most kMaxRendezvousBlob bytes.
void check_rendezvous_member(const RendezvousMember& me, std::string_view kind);
void check_rendezvous_blob(std::string_view blob, std::string_view kind);

// How every rendezvous words a timeout:
//   "<kind> rendezvous at <where> timed out on rank R of W after N ms: <what>"
std::string rendezvous_timeout_message(std::string_view kind, std::string_view where,
                                       const RendezvousMember& me, const Deadline& deadline,
                                       std::string_view what);

// Sleeps for `wait`, or until the deadline if that comes first.
void sleep_within(const Deadline& deadline, std::chrono::milliseconds wait);

}  // namespace zest
