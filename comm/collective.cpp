#include "zest/comm/collective.h"

#include <fmt/format.h>

#include <algorithm>
#include <iterator>

namespace zest {
namespace {

// dtype_name, which throws for a value no DType names; such a value is
// printed as a number instead.
std::string dtype_text(DType t) {
  const bool known =
      std::find(std::begin(kAllDTypes), std::end(kAllDTypes), t) != std::end(kAllDTypes);
  return known ? std::string(dtype_name(t)) : fmt::format("dtype {}", static_cast<int>(t));
}

}  // namespace

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
    case CollectiveKind::kSend: return "send";
    case CollectiveKind::kRecv: return "recv";
  }
  return "unknown";
}

std::string CollectiveDesc::str() const {
  std::string details;
  switch (kind) {
    case CollectiveKind::kAllReduce:
    case CollectiveKind::kReduceScatter:
      details = fmt::format("{} x {}, {}", count, dtype_text(dtype), reduce_op_name(op));
      break;
    case CollectiveKind::kAllGather:
      details = fmt::format("{} x {}", count, dtype_text(dtype));
      break;
    case CollectiveKind::kBroadcast:
      details = fmt::format("{} x {}, root {}", count, dtype_text(dtype), root);
      break;
    case CollectiveKind::kSend:
      details = fmt::format("{} x {}, to rank {}", count, dtype_text(dtype), root);
      break;
    case CollectiveKind::kRecv:
      details = fmt::format("{} x {}, from rank {}", count, dtype_text(dtype), root);
      break;
    case CollectiveKind::kBarrier:
    case CollectiveKind::kSplit:
      break;
  }
  if (collective_name(kind) == "unknown") return "unknown collective";
  if (tag != 0) details += fmt::format("{}tag {}", details.empty() ? "" : ", ", tag);
  if (details.empty()) return fmt::format("{} #{}", collective_name(kind), seq);
  return fmt::format("{} #{} ({})", collective_name(kind), seq, details);
}

std::string rank_list(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? "," : "") + std::to_string(ranks[i]);
  return s;
}

std::string divergence_message(std::string_view who,
                               const std::vector<std::pair<int, CollectiveDesc>>& calls) {
  std::vector<std::pair<CollectiveDesc, std::vector<int>>> groups;
  for (const auto& call : calls) {
    const CollectiveDesc& desc = call.second;  // not a structured binding: clang 14 cannot capture those
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& g) { return g.first == desc; });
    if (it == groups.end()) {
      groups.push_back({desc, {call.first}});
    } else {
      it->second.push_back(call.first);
    }
  }
  std::string text = fmt::format("{} ranks called different collectives:", who);
  for (size_t i = 0; i < groups.size(); ++i) {
    text += fmt::format("{} {} called {}", i ? ";" : "", rank_list(groups[i].second),
                        groups[i].first.str());
  }
  return text + ". Every rank must issue the same collectives in the same order with the same "
                "sizes.";
}

}  // namespace zest
