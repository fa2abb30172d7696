// The elements of each unit as the engine lays it out (layout.cpp's rules,
// layout_constants.h): shared by the memory estimator and the cost model,
// so that the bytes they count are those of one layout.
#pragma once

#include <cstddef>
#include <vector>

#include "zest/estimate/memory_estimate.h"

namespace zest {

// One UnitDescription (all `count` of its repeats) for P partitions.
struct UnitSize {
  size_t numel = 0;   // parameters
  size_t padded = 0;  // flat buffer: a multiple of P x kShardQuantum
  size_t shard = 0;   // padded / P
  size_t count = 1;
  bool resident = true;  // full parameters kept (not gathered on demand)
  bool frozen = false;
};

// P = options.partitions(): the world at stages 1-3, MiCS's shard group
// at stage 3 with mics_shard_size, 1 at stage 0.
std::vector<UnitSize> unit_sizes(const ModelDescription& model, const EstimateOptions& options);

// Stage 3 (Note [stage-3 reuse distance], engine_gather.cpp): per entry of
// `units`, how many of its repeats stay gathered from their forward to their
// backward, in a loop that gathers every unit forward in the description's
// order (repeats together), then backward in the reverse order, releasing
// each handle before the next gather. Those are its last repeats: the
// instance at forward position k is kept when the parameters of all the
// units after it, counted twice (once forward, once backward), are fewer
// than stage3_max_reuse_distance. Zero at stages 0-2, at distance 0, and
// for persistent units.
std::vector<size_t> reuse_kept(const std::vector<UnitSize>& units, const EstimateOptions& options);

}  // namespace zest
