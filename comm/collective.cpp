#include "zest/comm/collective.h"

#include <fmt/format.h>

namespace zest {

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
  }
  return "unknown";
}

std::string_view collective_name(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kSplit: return "split";
  }
  return "unknown";
}

std::string CollectiveDesc::str() const {
  switch (kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduceScatter:
      return fmt::format("{} #{} ({} x {}, {})", collective_name(kind), seq, count,
                         dtype_name(dtype), reduce_op_name(op));
    case CollectiveKind::kAllGather:
      return fmt::format("{} #{} ({} x {})", collective_name(kind), seq, count, dtype_name(dtype));
    case CollectiveKind::kBroadcast:
      return fmt::format("{} #{} ({} x {}, root {})", collective_name(kind), seq, count,
                         dtype_name(dtype), root);
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSplit:
      return fmt::format("{} #{}", collective_name(kind), seq);
  }
  return "unknown collective";
}

}  // namespace zest
