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
//
// Note [exchange messages stay eager]: a message over the transport's eager
// size waits for its receiver (a rendezvous): with Open MPI's single-copy
// transport (CMA) that is a handshake and a process_vm_readv, 4-60 us a
// message on the loaded 2-core VM where an eager one took 0.4 us (vader's
// eager limit, 4096 bytes with the headers, leaves 4040 for the message).
// So a payload over kHeadPayload bytes travels as two messages: the header
// and its first kHeadPayload bytes on the exchange's tag, the rest on a
// tail tag of its own. Only the header decides agreement: the tails are
// waited for after every rank's header matched, so a rank that expects a
// tail its peer (having made another call) never sends fails on the
// mismatch, not on a timeout; a tail receive has room for the largest tail,
// so no message is ever truncated; and a stray tail is left to a
// communicator that the mismatch aborted.
//
// Note [the broadcast root does not wait]: MPI_Bcast's root returns once its
// send is on its way; an exchange that the root waits out costs it the
// others' messages too (a 4 KiB broadcast took 1.9x MPI_Bcast's time with
// Open MPI's single-copy transport). So the root of a carried broadcast
// starts its exchange and returns, leaving the round pending: it is
// completed and checked (a mismatch named, a missing rank timed out as
// ever) when the root next agrees on a call, before that call's exchange
// starts, or when the communicator is destroyed. Its receivers check the
// root's descriptor against their own as every call does, so a receiver
// that made another call fails at once, and the root learns of it at its
// next call at the latest. At most max_pending() rounds are pending (their
// receives posted in order, so MPI's non-overtaking rule still matches
// each with its own exchange); a further broadcast first completes the
// oldest.
#pragma once

#include <mpi.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "zest/comm/collective.h"

namespace zest::mpi {

// A CollectiveDesc as fixed-size words.
constexpr int kDescWords = 7;
using DescWords = std::array<uint64_t, kDescWords>;

// A CollectiveDesc as fixed-size words, so that one exchange shows every
// rank's call to every rank (collectives and point-to-point transfers alike).
DescWords encode_desc(const CollectiveDesc& d);
CollectiveDesc decode_desc(const uint64_t* words);

// A part of the caller's data bound for one peer; empty for none.
struct Part {
  const void* data = nullptr;
  size_t bytes = 0;
};

// One exchange's messages: a slot per rank to send from and receive into,
// its requests and, once complete, every rank's words.
class Round {
 public:
  Round(int rank, int size, size_t slot_bytes);

  // The header messages' requests (receives first, then every send, tails
  // included), and where a wait puts their statuses (finish() reads the
  // receives' sizes from them).
  std::span<MPI_Request> requests() { return requests_; }
  MPI_Status* statuses() { return statuses_.data(); }
  // The tails' receives (Note [exchange messages stay eager]), to wait for
  // once the headers agree; and their statuses.
  std::span<MPI_Request> tail_requests() { return tail_requests_; }
  MPI_Status* tail_statuses() { return tail_statuses_.data(); }
  // This rank's own words for the round.
  const uint64_t* mine() const { return all_.data() + static_cast<size_t>(rank_) * kDescWords; }

  // After finish(): every rank's words in rank order, kDescWords per rank.
  const std::vector<uint64_t>& all() const { return all_; }
  // Peer r's payload (nullptr for this rank), and its size in bytes.
  const char* payload(int r) const;
  size_t payload_bytes(int r) const { return got_[static_cast<size_t>(r)]; }

 private:
  friend class Exchange;
  int rank_, size_;
  size_t slot_;
  std::vector<char> send_, recv_;      // a slot per rank
  std::vector<MPI_Request> requests_;  // header receives first, then sends
  std::vector<MPI_Status> statuses_;
  std::vector<MPI_Request> tail_requests_;
  std::vector<MPI_Status> tail_statuses_;
  std::vector<int> tail_from_;  // the peer of each tail receive
  std::vector<uint64_t> all_;
  std::vector<size_t> got_;
};

class Exchange {
 public:
  Exchange(int rank, int size);

  // The most payload bytes one message carries: 4 KiB, whatever the world
  // size (each round's slots take twice the world size times that, for
  // sending and receiving). Larger messages leave MPI's eager protocol for a
  // rendezvous through the slots, which loses to MPI's own collectives on
  // the caller's buffers (comm_bench: a 64 KiB all_gather on 2 ranks took
  // 2.5x raw MPI carried, with Open MPI's single-copy transport).
  static constexpr size_t kPayloadLimit = 4096;
  size_t payload_limit() const { return kPayloadLimit; }
  // The payload bytes a header message carries (Note [exchange messages stay
  // eager]): with the header, 3,128 bytes, and a tail of at most 1,024.
  static constexpr size_t kHeadPayload = 3072;
  // How many rounds may be left pending (Note [the broadcast root does not
  // wait]): a few calls' worth on small worlds, one on large ones, where a
  // round's slots are large.
  size_t max_pending() const;

  // Starts a round on `comm`: `mine` and part_for(peer) (at most
  // payload_limit() bytes) to every peer, and a receive from each, with a
  // tail receive from each peer for which expect(peer) is over
  // kHeadPayload bytes. Its requests complete when every peer's header
  // message is here, its tail requests when the tails are. Needs fewer than
  // max_pending() rounds pending.
  Round& start(MPI_Comm comm, const DescWords& mine, const std::function<Part(int peer)>& part_for,
               const std::function<size_t(int peer)>& expect);

  // Unpacks a round's completed header receives into its all() and payload
  // sizes; finish_tails adds the tails' sizes once they are complete.
  void finish(Round& round);
  void finish_tails(Round& round);

  // The last round started.
  Round& current() { return *rounds_[current_]; }
  const Round& current() const { return *rounds_[current_]; }

  // Leaves the current round pending (its requests not yet complete); the
  // oldest pending round, or nullptr; and the end of the oldest's wait.
  void leave_pending();
  Round* oldest_pending();
  void settled_oldest();
  size_t pending() const { return pending_count_; }

 private:
  static constexpr int kTag = 0x2e57;  // "zest"'s, on a communicator only ZEST uses
  static constexpr int kTailTag = 0x2e58;
  size_t slot_bytes() const { return sizeof(DescWords) + kPayloadLimit; }

  int rank_, size_;
  // A ring of max_pending() + 1 rounds, each allocated when first used (a
  // communicator that never collects costs nothing): the pending ones from
  // oldest_ on, then the one a start takes.
  std::vector<std::unique_ptr<Round>> rounds_;
  size_t current_ = 0;
  size_t oldest_ = 0;
  size_t pending_count_ = 0;
};

}  // namespace zest::mpi
