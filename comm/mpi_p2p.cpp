// The MPI backend's point-to-point transfers.
//
// Note [point-to-point over MPI]. Each side of a message first exchanges its
// description with the peer (the sender's desc goes to the receiver, the
// receiver's back to the sender, on tags of their own), so both sides learn
// whether they agree before any data moves: a mismatch fails both, naming
// both calls, and no data message is ever sent that does not fit its
// receive (the reason the collectives agree first too, mpi_transfer.h). A
// message of at most Exchange::kPayloadLimit bytes rides on the sender's
// description (the receive has room for that much whatever was posted), so
// it costs one round; a larger one then moves as one MPI_Isend/MPI_Irecv
// pair on the caller's buffers. Every side of a send_recv is started before
// any is waited for, so a ring of ranks each sending to the next and
// receiving from the previous completes. MPI's non-overtaking rule matches
// the n-th message of a pair with the n-th receive, as the numbering says.
// Waits poll like the collectives' (mpi_poll.h) and read the presence
// channel, so a peer that left or never posts its side is named.
#include <algorithm>
#include <climits>
#include <cstring>
#include <optional>

#include <fmt/ranges.h>

#include "zest/comm/mpi_comm.h"
#include "zest/comm/detail/mpi_exchange.h"
#include "zest/comm/detail/mpi_poll.h"
#include "zest/comm/detail/mpi_presence.h"
#include "zest/core/mpi_check.h"

namespace zest {
namespace {

constexpr int kHeaderTag = 0x2e5a;  // sender -> receiver: its desc, and a small message's data
constexpr int kAckTag = 0x2e5b;     // receiver -> sender: its desc
constexpr int kDataTag = 0x2e5c;    // a large message's data
constexpr size_t kLimit = mpi::Exchange::kPayloadLimit;
// How long a wait for a carried message keeps testing before it sleeps:
// long enough for the rendezvous of a description of 4 KiB and more, short
// enough that two ranks sharing a core (an oversubscribed host) do not keep
// each other off it for a time slice (p2p_bench: 100 ms of testing made
// some runs' 4 KiB exchanges take 24 ms; docs/BENCHMARKS.md).
constexpr std::chrono::microseconds kCarriedBusy{1000};


MPI_Datatype copy_type(DType t) {
  switch (elem_size(t)) {
    case 1: return MPI_UINT8_T;
    case 2: return MPI_UINT16_T;
    case 4: return MPI_UINT32_T;
    default: return MPI_UINT64_T;
  }
}

// One side's messages: its header (out for a send, in for a recv, with room
// for a carried payload) and the peer's. Kept alive by MPI should a wait be
// given up.
struct Side {
  std::vector<uint64_t> header;  // kDescWords, then the payload
  mpi::DescWords peer{};
};

struct Buffers {
  std::vector<Side> sides;
  std::vector<MPI_Request> requests;
};

std::string what_of(std::span<const P2PCall> calls) {
  if (calls.size() == 1) return calls.front().desc.str();
  return fmt::format("send_recv of {} transfers ({}, ...)", calls.size(), calls.front().desc.str());
}

}  // namespace

void MpiCommunicator::do_send_recv(std::span<const P2PCall> calls, const Stream& /*stream*/) {
  auto buffers = std::make_shared<Buffers>();
  Buffers& b = *buffers;
  b.sides.resize(calls.size());
  const auto issue = [&](const std::string& what, auto&& fn) {
    try {
      fn();
    } catch (const CommError&) {
      throw;
    } catch (const Error& e) {
      // Requests may be pending: their buffers stay with MPI.
      MpiEnvironment::keep_until_exit(buffers);
      fail(CommError::Reason::kBackend,
           fmt::format("MPI {} failed on rank {} of {}: {}", what, rank(), size(), e.message()));
    }
  };
  const std::string what = what_of(calls);
  issue(what, [&] {
    b.requests.clear();
    b.requests.reserve(calls.size() * 2);
    // Receives first, as the collectives' steps post them.
    for (size_t i = 0; i < calls.size(); ++i) {
      const CollectiveDesc& d = calls[i].desc;
      Side& side = b.sides[i];
      b.requests.push_back(MPI_REQUEST_NULL);
      if (d.kind == CollectiveKind::kRecv) {
        side.header.assign(mpi::kDescWords + kLimit / sizeof(uint64_t), 0);
        ZEST_MPI_CHECK(MPI_Irecv(side.header.data(), static_cast<int>(side.header.size()), MPI_UINT64_T, d.root,
                                 kHeaderTag, owned_.comm, &b.requests.back()));
      } else {
        ZEST_MPI_CHECK(MPI_Irecv(side.peer.data(), mpi::kDescWords, MPI_UINT64_T, d.root, kAckTag, owned_.comm,
                                 &b.requests.back()));
      }
    }
    for (size_t i = 0; i < calls.size(); ++i) {
      const CollectiveDesc& d = calls[i].desc;
      Side& side = b.sides[i];
      const mpi::DescWords mine = mpi::encode_desc(d);
      b.requests.push_back(MPI_REQUEST_NULL);
      if (d.kind == CollectiveKind::kSend) {
        const size_t bytes = d.count * elem_size(d.dtype);
        const bool carry = bytes <= kLimit;
        side.header.assign(mpi::kDescWords + (carry ? (bytes + 7) / 8 : 0), 0);
        std::copy(mine.begin(), mine.end(), side.header.begin());
        if (carry && bytes > 0) std::memcpy(side.header.data() + mpi::kDescWords, calls[i].buffer, bytes);
        ZEST_MPI_CHECK(MPI_Isend(side.header.data(), static_cast<int>(side.header.size()), MPI_UINT64_T, d.root,
                                 kHeaderTag, owned_.comm, &b.requests.back()));
      } else {
        side.peer = mine;  // sent from here; the peer's words arrive in header
        ZEST_MPI_CHECK(MPI_Isend(side.peer.data(), mpi::kDescWords, MPI_UINT64_T, d.root, kAckTag, owned_.comm,
                                 &b.requests.back()));
      }
    }
  });
  wait_p2p(calls, b.requests, /*moving_data=*/false, buffers);
  // Both sides of every message now hold both descriptions.
  for (size_t i = 0; i < calls.size(); ++i) {
    const CollectiveDesc& d = calls[i].desc;
    const Side& side = b.sides[i];
    const bool sending = d.kind == CollectiveKind::kSend;
    const CollectiveDesc other = mpi::decode_desc(sending ? side.peer.data() : side.header.data());
    const CollectiveDesc& send = sending ? d : other;
    const CollectiveDesc& recv = sending ? other : d;
    const int sender = sending ? rank() : d.root;
    const int receiver = sending ? d.root : rank();
    if (!p2p_match(send, sender, recv, receiver)) {
      fail(CommError::Reason::kMismatch, p2p_mismatch_message("MPI", send, sender, recv, receiver));
    }
  }
  // Agreed: a carried message is here; a large one moves now.
  b.requests.clear();
  for (size_t i = 0; i < calls.size(); ++i) {
    const CollectiveDesc& d = calls[i].desc;
    const size_t bytes = d.count * elem_size(d.dtype);
    if (bytes == 0) continue;
    if (bytes <= kLimit) {
      if (d.kind == CollectiveKind::kRecv) std::memcpy(calls[i].buffer, b.sides[i].header.data() + mpi::kDescWords, bytes);
      continue;
    }
    // Refused alike on both sides, which agreed on the count.
    ZEST_CHECK(d.count <= static_cast<uint64_t>(INT_MAX),
               "MPI {}: at most {} elements per message; send the buffer as several messages",
               d.str(), INT_MAX);
  }
  issue(what, [&] {
    for (size_t i = 0; i < calls.size(); ++i) {
      const CollectiveDesc& d = calls[i].desc;
      if (d.count * elem_size(d.dtype) <= kLimit) continue;
      b.requests.push_back(MPI_REQUEST_NULL);
      const int n = static_cast<int>(d.count);
      if (d.kind == CollectiveKind::kRecv) {
        ZEST_MPI_CHECK(MPI_Irecv(calls[i].buffer, n, copy_type(d.dtype), d.root, kDataTag, owned_.comm,
                                 &b.requests.back()));
      } else {
        ZEST_MPI_CHECK(MPI_Isend(calls[i].buffer, n, copy_type(d.dtype), d.root, kDataTag, owned_.comm,
                                 &b.requests.back()));
      }
    }
  });
  if (!b.requests.empty()) wait_p2p(calls, b.requests, /*moving_data=*/true, buffers);
}

void MpiCommunicator::wait_p2p(std::span<const P2PCall> calls, std::span<MPI_Request> requests, bool moving_data,
                               std::shared_ptr<void> buffers) {
  std::vector<int> peers;  // world ranks of the peers, and their ranks here
  std::vector<int> peer_ranks;
  uint64_t bytes = 0;
  for (const P2PCall& c : calls) {
    bytes += c.desc.count * elem_size(c.desc.dtype);
    if (std::find(peer_ranks.begin(), peer_ranks.end(), c.desc.root) != peer_ranks.end()) continue;
    peer_ranks.push_back(c.desc.root);
    peers.push_back(world_ranks_[static_cast<size_t>(c.desc.root)]);
  }
  std::string what;
  std::optional<mpi::Departure> departed;
  std::optional<Deadline> departed_grace;
  const auto between = [&] {
    if (what.empty()) what = what_of(calls);
    mpi::serve_presence(mpi::WaitingIn{what, rank(), size(), moving_data});
    if (!departed) {
      departed = mpi::departed_among(peers);
      if (departed) departed_grace.emplace(std::min<std::chrono::milliseconds>(kDepartedGrace, options().timeout));
    }
    return departed_grace && departed_grace->passed();
  };
  bool done = false;
  try {
    // As the collectives' waits (poll_plan): spin for the bytes' time at
    // 1 GB/s, then, moving data, keep testing a while before sleeping. A
    // description that carries a message moves data too: at 4 KiB it
    // leaves MPI's eager protocol, whose rendezvous progresses only inside
    // MPI_Test, and sleeping between tests made a 4 KiB exchange take
    // 0.6-1.3 ms instead of microseconds (p2p_bench, docs/BENCHMARKS.md);
    // briefly (kCarriedBusy), since both sides of it are usually there.
    const auto transfer = std::chrono::microseconds(static_cast<int64_t>(std::min<uint64_t>(bytes / 1000, INT32_MAX)));
    const bool carrying = !moving_data && bytes > 0 && std::all_of(calls.begin(), calls.end(), [](const P2PCall& c) {
      return c.desc.count * elem_size(c.desc.dtype) <= kLimit;
    });
    const std::chrono::microseconds busy =
        moving_data ? kDataBusy + transfer : carrying ? kCarriedBusy + transfer : std::chrono::microseconds(0);
    mpi::PollPlan plan{options().spin + transfer, busy, between};
    done = mpi::poll_until(requests, MPI_STATUSES_IGNORE, Deadline(options().timeout), plan);
  } catch (const Error& e) {
    MpiEnvironment::keep_until_exit(std::move(buffers));
    fail(CommError::Reason::kBackend,
         fmt::format("MPI {} failed on rank {} of {}: {}", what_of(calls), rank(), size(), e.message()));
  }
  if (done) return;
  MpiEnvironment::keep_until_exit(std::move(buffers));
  if (what.empty()) what = what_of(calls);
  if (departed_grace && departed_grace->passed()) {
    mpi::object_to_departure(departed->world_rank, mpi::WaitingIn{what, rank(), size(), moving_data});
    const auto it = std::find(world_ranks_.begin(), world_ranks_.end(), departed->world_rank);
    fail(CommError::Reason::kAborted,
         fmt::format("MPI {} cannot complete on rank {} of {}: its peer rank {} ({}) {} while this rank "
                     "waited for it; the job cannot go on without it",
                     what, rank(), size(), it - world_ranks_.begin(), mpi::describe_world_rank(departed->world_rank),
                     departed->how));
  }
  // Where the peers are, from their answers.
  std::vector<std::string> where;
  if (mpi::presence_open()) {
    const auto grace = std::min<std::chrono::milliseconds>(kAskGrace, options().timeout);
    const auto answers = mpi::ask_members(peers, mpi::WaitingIn{what, rank(), size(), moving_data}, grace);
    for (size_t i = 0; i < peers.size(); ++i) {
      const std::string who = fmt::format("rank {} ({})", peer_ranks[i], mpi::describe_world_rank(peers[i]));
      const auto& a = answers[i];
      where.push_back(a ? fmt::format("{} is {} {} on a communicator of {} ranks", who,
                                      a->moving_data ? "moving the data of" : "waiting in", a->what, a->comm_size)
                        : fmt::format("{} did not answer within {} ms (stopped, busy outside ZEST's calls, "
                                      "or dead)", who, grace.count()));
    }
  } else {
    where.push_back("where the peers are is unknown (no presence channel: make_mpi_world opens one)");
  }
  fail(CommError::Reason::kTimeout,
       fmt::format("MPI {} timed out after {} ms on rank {} of {} {}: {}", what, options().timeout.count(), rank(),
                   size(),
                   moving_data ? "while moving its data (both sides had posted it)"
                               : "waiting for the peer to post its side",
                   fmt::join(where, "; ")));
}

}  // namespace zest
