#include "zest/estimate/unit_sizes.h"

#include <algorithm>
#include <cstdint>

#include "zest/engine/layout_constants.h"

namespace zest {

std::vector<UnitSize> unit_sizes(const ModelDescription& model, const EstimateOptions& o) {
  const int P = o.partitions();
  std::vector<UnitSize> out;
  for (const UnitDescription& u : model.units) {
    size_t end = 0;
    for (size_t n : u.param_numels) end = aligned_param_offset(end) + n;
    UnitSize s;
    s.numel = u.numel();
    s.padded = padded_unit_numel(end, P);
    s.shard = s.padded / static_cast<size_t>(P);
    s.count = u.count;
    s.frozen = u.frozen;
    s.resident =
        resident_unit(o.zero.stage, P, o.offloads_params(), s.numel, o.zero.stage3_param_persistence_threshold);
    out.push_back(s);
  }
  return out;
}

std::vector<size_t> reuse_kept(const std::vector<UnitSize>& units, const EstimateOptions& o) {
  std::vector<size_t> kept(units.size(), 0);
  if (o.zero.stage != 3) return kept;
  const auto distance = static_cast<uint64_t>(std::max<int64_t>(o.zero.stage3_max_reuse_distance, 0));
  uint64_t after = 0;  // parameters of the instances after the current one
  for (size_t e = units.size(); e-- > 0;) {
    const UnitSize& u = units[e];
    for (size_t c = 0; c < u.count; ++c) {
      if (2 * after >= distance) return kept;  // and so for every earlier one
      if (!u.resident) ++kept[e];
      after += u.numel;
    }
  }
  return kept;
}

}  // namespace zest
