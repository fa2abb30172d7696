// A laid-out model as the memory estimator describes it, so an example can
// set the engine's measured memory beside zest::estimate_memory's figures.
#pragma once

#include "zest/engine/layout.h"
#include "zest/estimate/memory_estimate.h"

namespace examples {

// Each unit of the layout with its parameters in flat (layout) order.
zest::ModelDescription describe_model(const zest::ModelLayout& layout);

}  // namespace examples
