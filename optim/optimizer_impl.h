// Internal: the per-device implementations behind optimizer_step().
#pragma once

#include "zest/optim/optimizer.h"

namespace zest::detail {

void optimizer_step_host(const OptimizerConfig& config, const ShardBuffers& shard,
                         const StepScalars& scalars);

}  // namespace zest::detail
