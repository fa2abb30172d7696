// Communication volume, counted per operation kind, so that the engine's
// traffic can be checked against the ZeRO paper's model.
//
// Bytes are those a bandwidth-optimal (ring) algorithm moves per rank, the
// model the paper and nccl-tests' "bus bandwidth" use: with W ranks and a
// buffer of B bytes in all,
//   all_reduce      sends and receives 2 (W-1)/W B
//   reduce_scatter  sends and receives   (W-1)/W B   (B = W x the received part)
//   all_gather      sends and receives   (W-1)/W B   (B = W x the sent part)
//   broadcast       the root sends B, every other rank receives B
// and nothing when W = 1. They are what the algorithm must move, not a
// measurement of what a library did on the wire. Point-to-point transfers
// (p2p.h) count exactly: a send of B bytes adds B to counters[kSend]'s
// bytes_sent and one call; the matching recv adds B to counters[kRecv]'s
// bytes_received. The totals include them.
#pragma once

#include <array>
#include <cstdint>

#include "zest/comm/collective.h"

namespace zest {

struct CollectiveCounter {
  uint64_t calls = 0;
  uint64_t elements = 0;        // sum of the whole buffers' element counts (B / elem_size)
  double bytes_sent = 0;        // ring model, per this rank
  double bytes_received = 0;
};

struct CommCounters {
  std::array<CollectiveCounter, kNumCollectiveKinds> per_kind{};

  const CollectiveCounter& operator[](CollectiveKind k) const {
    return per_kind[static_cast<size_t>(k)];
  }
  CollectiveCounter& operator[](CollectiveKind k) { return per_kind[static_cast<size_t>(k)]; }

  double total_bytes_sent() const;
  double total_bytes_received() const;

  // Adds one call described by `desc` on a communicator of `world_size`
  // ranks, this rank being `rank`.
  void record(const CollectiveDesc& desc, int rank, int world_size);
};

}  // namespace zest
