// The MPI backend's agreement on each collective, carrying a small
// collective's data with it. Internal (includes <mpi.h>).
//
// Note [one exchange per collective]: before any data moves, every rank must
// know that every other rank called the same collective (a rank that called
// another, or with another count, would make the data phase hang or
// misread), and a mismatch must name every rank's call. That takes one
// message from each rank to each other rank, carrying the caller's
// CollectiveDesc. A collective whose data is small rides on that message
// (the header, then the payload bound for that peer), so it costs one
// exchange in all, as MPI's own small collectives do, instead of an
// agreement round trip followed by the data's.
//
// The exchange is point to point (MPI_Isend/MPI_Irecv to and from every
// peer, on one tag of the communicator's own), never a collective, so ranks
// that disagree still complete it: every rank sends exactly one message to
// each peer whatever it called, and each receive has room for the largest
// message any call may send (the header and payload_limit() bytes, the
// same on every rank). MPI's
// non-overtaking rule matches the k-th exchange's messages with each other.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace zest::mpi {

// A CollectiveDesc as fixed-size words.
constexpr int kDescWords = 7;
using DescWords = std::array<uint64_t, kDescWords>;

// A part of the caller's data bound for one peer; empty for none.
struct Part {
  const void* data = nullptr;
  size_t bytes = 0;
};

class Exchange {
 public:
  Exchange(int rank, int size);

  // The most payload bytes one message carries: 4 KiB, whatever the world
  // size (the slots take twice the world size times that, for sending and
  // receiving). Larger messages leave MPI's eager protocol for a rendezvous
  // through the slots, which loses to MPI's own collectives on the caller's
  // buffers (comm_bench: a 64 KiB all_gather on 2 ranks took 2.5x raw MPI
  // carried, with Open MPI's single-copy transport).
  static constexpr size_t kPayloadLimit = 4096;
  size_t payload_limit() const { return kPayloadLimit; }

  // Starts the exchange on `comm`: `mine` and part_for(peer) (at most
  // payload_limit() bytes) to every peer, and a receive from each. The
  // returned requests complete when every peer's message is here.
  std::span<MPI_Request> start(MPI_Comm comm, const DescWords& mine,
                               const std::function<Part(int peer)>& part_for);

  // Where the wait for start()'s requests puts their statuses (finish()
  // reads the receives' sizes from them).
  MPI_Status* statuses() { return statuses_.data(); }

  // After completion: every rank's words in rank order (this rank's its own),
  // kDescWords per rank.
  const std::vector<uint64_t>& all() const { return all_; }
  // Peer r's payload (nullptr for this rank), and its size in bytes.
  const char* payload(int r) const;
  size_t payload_bytes(int r) const { return got_[static_cast<size_t>(r)]; }
  // Unpacks the completed receives into all() and the payload sizes.
  void finish();

 private:
  static constexpr int kTag = 0x2e57;  // "zest"'s, on a communicator only ZEST uses
  size_t slot_bytes() const { return sizeof(DescWords) + kPayloadLimit; }

  int rank_, size_;
  std::vector<char> send_, recv_;     // a slot per rank
  std::vector<MPI_Request> requests_;  // receives first, then sends
  std::vector<MPI_Status> statuses_;
  std::vector<uint64_t> all_;
  std::vector<size_t> got_;
};

}  // namespace zest::mpi
