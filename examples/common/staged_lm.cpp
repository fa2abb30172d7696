#include "common/staged_lm.h"

#include <algorithm>
#include <stdexcept>

#include <fmt/format.h>

namespace examples {

std::pair<int64_t, int64_t> Placement::blocks(int64_t layers) const {
  const int64_t each = layers / stages, extra = layers % stages;
  const int64_t begin = stage * each + std::min<int64_t>(stage, extra);
  return {begin, begin + each + (stage < extra ? 1 : 0)};
}

void Placement::validate_stages(int64_t layers) const {
  if (stages < 1 || stage < 0 || stage >= stages || stages > layers) {
    throw std::invalid_argument(fmt::format(
        "{} pipeline stages for {} layers: each stage needs a block; use at most {} stages", stages, layers, layers));
  }
}

Placement placement_of(const zest::DeviceMesh* mesh) {
  if (mesh == nullptr) return {};
  return {.tp = &mesh->tp(), .stage = mesh->pp_rank(), .stages = mesh->shape().pp};
}

}  // namespace examples
