// What a collective call is, as data: its kind, element type, element count,
// reduction and root, and its sequence number on the communicator. Ranks
// compare these to catch programs that diverged (different operations or sizes
// on different ranks) and errors name them, so a hang or a mismatch says which
// operation, which call and which ranks.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zest/core/dtype.h"

namespace zest {

enum class ReduceOp : uint8_t { kSum, kAvg, kMax };

enum class CollectiveKind : uint8_t {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kBarrier,
  kSplit,  // creating a sub-communicator is collective too
  // Point-to-point transfers (p2p.h): one side of a message between two
  // ranks. `root` is the other rank, `seq` numbers the messages from this
  // rank to that one (send) or from that one to this (recv), each from 1.
  kSend,
  kRecv,
};

inline constexpr int kNumCollectiveKinds = 8;

std::string_view reduce_op_name(ReduceOp op);
std::string_view collective_name(CollectiveKind kind);

struct CollectiveDesc {
  CollectiveKind kind = CollectiveKind::kBarrier;
  DType dtype = DType::kUInt8;
  ReduceOp op = ReduceOp::kSum;  // meaningful for all_reduce and reduce_scatter
  int32_t root = -1;             // broadcast: the root; send and recv: the peer
  // Elements per rank's part: all_reduce and broadcast the whole buffer,
  // reduce_scatter the received part, all_gather the sent part.
  uint64_t count = 0;
  // 1 for the communicator's first collective, then 2, 3, ...; for send and
  // recv, the message's number between this rank and the peer, that way.
  uint64_t seq = 0;
  // What the caller says the call is for (the engine: which unit a stage-3
  // gather is of), compared across ranks like the rest, so that calls alike
  // in size but meant for different things are a divergence, not a silent
  // exchange of the wrong data. 0: none.
  uint64_t tag = 0;

  // "all_reduce #12 (4099 x fp32, sum)", "all_gather #7 (512 x bf16, tag 3)",
  // "send #2 (8 x fp32, to rank 1)", "recv #2 (8 x fp32, from rank 0)".
  // Never throws for values outside the
  // enums ("dtype 42"): it describes calls that are broken, too.
  std::string str() const;

  friend bool operator==(const CollectiveDesc&, const CollectiveDesc&) = default;
};

// "rank 3", "ranks 0,2,5", or "none", as errors name ranks.
std::string rank_list(const std::vector<int>& ranks);

// What every backend reports when ranks diverged: the ranks grouped by what
// they called, in order of first appearance, as
//   "<who> ranks called different collectives: ranks 0,2 called all_reduce #2
//    (8 x fp32, sum); rank 1 called all_gather #2 (8 x fp32). Every rank must ..."
// `calls` holds (rank, its call) in rank order, for the ranks that are known.
std::string divergence_message(std::string_view who,
                               const std::vector<std::pair<int, CollectiveDesc>>& calls);

}  // namespace zest
