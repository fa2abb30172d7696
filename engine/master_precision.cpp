#include "zest/engine/master_precision.h"

#include "zest/core/check.h"

namespace zest {

void check_master_precision(const MasterPrecision& p) {
  for (const DType d : {p.master, p.state}) {
    ZEST_CHECK(d == DType::kFloat32 || d == DType::kBFloat16,
               "master weights and optimizer state are fp32 or bf16, not {}", dtype_name(d));
  }
  if (p.master == DType::kFloat32 && p.state == DType::kFloat32) return;
  ZEST_CHECK(p.master == DType::kBFloat16,
             "bf16.bf16_optimizer_states needs bf16.bf16_master_weights_and_grads (DeepSpeed's rule: "
             "bf16_optimizer_states requires bf16_master_weights_and_grads); turn both on, or this one off");
  ZEST_CHECK(p.compute == DType::kBFloat16,
             "bf16.bf16_master_weights_and_grads with {} compute: bf16 master weights need bf16 compute (they are the "
             "bf16 parameters): set bf16.enabled true (and fp16 off)",
             dtype_name(p.compute));
  ZEST_CHECK(p.stage >= 1,
             "bf16.bf16_master_weights_and_grads is only supported with ZeRO stage 1, 2 or 3 (as in DeepSpeed); this "
             "is stage 0: set zero_optimization.stage");
  ZEST_CHECK(p.state == DType::kBFloat16 || p.offloads_optimizer,
             "bf16.bf16_master_weights_and_grads without bf16_optimizer_states keeps fp32 optimizer state beside "
             "bf16 master weights, which DeepSpeed allows only with ZeRO-Offload: bf16 master weights over fp32 "
             "optimizer state need offload_optimizer cpu; turn on bf16.bf16_optimizer_states too, or offload the "
             "optimizer");
  ZEST_CHECK(p.grad_accum.value_or(p.compute) == p.compute,
             "bf16.bf16_master_weights_and_grads keeps the gradients in bf16, but data_types.grad_accum_dtype is {}: "
             "remove grad_accum_dtype, or set it to \"bf16\"",
             dtype_name(p.grad_accum.value_or(p.compute)));
  ZEST_CHECK(p.optimizer != OptimizerKind::kLamb,
             "optimizer Lamb with bf16.bf16_master_weights_and_grads is not supported: ZEST's LAMB keeps fp32 master "
             "weights and state; use AdamW, or turn the bf16 master weights off");
}

}  // namespace zest
