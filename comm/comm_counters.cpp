#include "zest/comm/comm_counters.h"

namespace zest {

double CommCounters::total_bytes_sent() const {
  double total = 0;
  for (const CollectiveCounter& c : per_kind) total += c.bytes_sent;
  return total;
}

double CommCounters::total_bytes_received() const {
  double total = 0;
  for (const CollectiveCounter& c : per_kind) total += c.bytes_received;
  return total;
}

void CommCounters::record(const CollectiveDesc& desc, int rank, int world_size) {
  CollectiveCounter& c = (*this)[desc.kind];
  ++c.calls;
  const auto w = static_cast<double>(world_size);
  const double es = static_cast<double>(elem_size(desc.dtype));
  switch (desc.kind) {
    case CollectiveKind::kAllReduce: {
      c.elements += desc.count;
      const double bytes = 2.0 * (w - 1.0) / w * static_cast<double>(desc.count) * es;
      c.bytes_sent += bytes;
      c.bytes_received += bytes;
      break;
    }
    case CollectiveKind::kReduceScatter:
    case CollectiveKind::kAllGather: {
      // count is one rank's part; the whole buffer is world_size parts, of
      // which every rank sends and receives all but one.
      c.elements += desc.count * static_cast<uint64_t>(world_size);
      const double bytes = (w - 1.0) * static_cast<double>(desc.count) * es;
      c.bytes_sent += bytes;
      c.bytes_received += bytes;
      break;
    }
    case CollectiveKind::kBroadcast: {
      c.elements += desc.count;
      if (world_size > 1) {
        const double bytes = static_cast<double>(desc.count) * es;
        if (rank == desc.root) {
          c.bytes_sent += bytes;
        } else {
          c.bytes_received += bytes;
        }
      }
      break;
    }
    case CollectiveKind::kSend:
      // Exactly what travels: the message, once, to one peer.
      c.elements += desc.count;
      c.bytes_sent += static_cast<double>(desc.count) * es;
      break;
    case CollectiveKind::kRecv:
      c.elements += desc.count;
      c.bytes_received += static_cast<double>(desc.count) * es;
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSplit:
      break;
  }
}

}  // namespace zest
