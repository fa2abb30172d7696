#include "zest/estimate/unit_sizes.h"

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

}  // namespace zest
