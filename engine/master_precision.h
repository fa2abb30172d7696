// What the master weights and the optimizer state may be kept in, checked
// once for the engine (EngineConfig) and the estimator (EstimateOptions):
// DeepSpeed's rules for bf16.bf16_master_weights_and_grads and
// bf16_optimizer_states (runtime/config.py's _do_error_check and ZeRO's
// _configure_master_weights), with ZEST's own where it keeps things
// differently (Note [bf16 master weights and optimizer state] in
// optim/optimizer.h).
#pragma once

#include <optional>

#include "zest/core/dtype.h"
#include "zest/optim/optimizer.h"

namespace zest {

struct MasterPrecision {
  DType compute = DType::kFloat32;
  DType master = DType::kFloat32;  // fp32, or bf16
  DType state = DType::kFloat32;   // fp32, or bf16
  int stage = 0;
  bool offloads_optimizer = false;
  OptimizerKind optimizer = OptimizerKind::kAdamW;
  std::optional<DType> grad_accum;  // data_types.grad_accum_dtype, when set
};

// A zest::Error naming the key and the way out for a choice the engine does
// not run; nothing for fp32 master weights and state.
void check_master_precision(const MasterPrecision& p);

}  // namespace zest
