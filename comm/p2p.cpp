#include "zest/comm/p2p.h"

#include <fmt/format.h>

namespace zest {

bool p2p_match(const CollectiveDesc& send, int sender, const CollectiveDesc& recv, int receiver) {
  return send.kind == CollectiveKind::kSend && recv.kind == CollectiveKind::kRecv &&
         send.root == receiver && recv.root == sender && send.seq == recv.seq &&
         send.dtype == recv.dtype && send.count == recv.count && send.tag == recv.tag;
}

std::string p2p_mismatch_message(std::string_view who, const CollectiveDesc& send, int sender,
                                 const CollectiveDesc& recv, int receiver) {
  return fmt::format("{} transfer mismatch: rank {}'s {} meets rank {}'s {}. The sender and the "
                     "receiver of every message must agree on its dtype, element count and tag, "
                     "message by message in the order the pair sends them",
                     who, sender, send.str(), receiver, recv.str());
}

}  // namespace zest
