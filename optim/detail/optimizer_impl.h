// Internal: the per-element updates behind optimizer_step(), shared by the
// host loop (optimizer_host.cpp) and the CUDA kernel (optimizer_cuda.cu).
//
// Note [same bits on host and GPU]: both backends run these very functions,
// so they perform the same float operations in the same order. Each is an
// IEEE round-to-nearest operation on both sides: nvcc keeps exact division and
// sqrt and denormals unless told otherwise; optimizer_cuda.cu is compiled with
// -fmad=false and optimizer_host.cpp with -ffp-contract=off (optim/
// CMakeLists.txt), so no multiply-add is fused into an FMA that rounds once
// instead of twice. The per-step constants that need pow() are computed once
// on the host (adam_step below) and handed to both, since the GPU's powf may
// differ from the host's in the last bit. fp16/bf16 loads and stores use
// CUDA's conversions on the GPU, which round like core/float16.h's
// (tests/cuda/test_cuda_float16.cu). The result: a shard stepped on the GPU
// has the host's bits, except for the payloads of NaNs (the GPU returns its
// canonical NaN); tests/cuda/test_cuda_optim.cu checks every optimizer and
// dtype pair.
#pragma once

#include <math.h>  // sqrtf, callable from host and device code alike

#include <string_view>
#include <type_traits>

#include "zest/core/check.h"
#include "zest/core/platform.h"
#include "zest/optim/detail/dtype_dispatch.h"
#include "zest/optim/optimizer.h"

namespace zest::detail {

// Adam / AdamW constants of one step.
struct AdamStep {
  bool decoupled = true;      // AdamW: decay the weight, not the gradient
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float eps = 0.0f;
  float weight_decay = 0.0f;  // Adam's L2 term
  float grad_scale = 1.0f;
  float step_size = 0.0f;     // lr / (1 - beta1^t)
  float bc2_sqrt = 1.0f;      // sqrt(1 - beta2^t)
  float decay = 1.0f;         // 1 - lr * weight_decay, AdamW's decoupled decay
};

// SGD constants of one step.
struct SgdStep {
  float lr = 0.0f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  bool first = true;  // step 1: the momentum buffer starts as the gradient
};

AdamStep adam_step(const OptimizerConfig& config, const StepScalars& scalars);
SgdStep sgd_step(const OptimizerConfig& config, const StepScalars& scalars);

// One element: `grad` is the stored gradient widened to float; w, m, v are
// read and written back. kDecoupled is AdamStep::decoupled made a constant, so
// the host's loop has no branch in it and vectorizes (optimizer_host.cpp).
template <bool kDecoupled>
ZEST_HOST_DEVICE inline void adam_update_as(const AdamStep& a, float grad, float& w, float& m, float& v) {
  float g = grad * a.grad_scale;
  float wi = w;
  if constexpr (kDecoupled) {
    wi *= a.decay;
  } else {
    g += a.weight_decay * wi;
  }
  const float mi = a.beta1 * m + (1.0f - a.beta1) * g;
  const float vi = a.beta2 * v + (1.0f - a.beta2) * g * g;
  const float denom = sqrtf(vi) / a.bc2_sqrt + a.eps;
  wi -= a.step_size * (mi / denom);
  m = mi;
  v = vi;
  w = wi;
}

ZEST_HOST_DEVICE inline void adam_update(const AdamStep& a, float grad, float& w, float& m, float& v) {
  if (a.decoupled) {
    adam_update_as<true>(a, grad, w, m, v);
  } else {
    adam_update_as<false>(a, grad, w, m, v);
  }
}

// One element; `buf` is the element's momentum buffer, null without momentum.
// At the first step it is written, never read.
ZEST_HOST_DEVICE inline void sgd_update(const SgdStep& s, float grad, float& w, float* buf) {
  float g = grad * s.grad_scale;
  float wi = w;
  g += s.weight_decay * wi;
  if (s.momentum != 0.0f) {
    const float b = s.first ? g : s.momentum * *buf + (1.0f - s.dampening) * g;
    *buf = b;
    g = s.nesterov ? g + s.momentum * b : b;
  }
  wi -= s.lr * g;
  w = wi;
}

// Calls f(TG, TP, TW, TS), each a std::type_identity: the shard's gradient
// storage type, parameter output type (void without an output), master
// weight type and state type, for the combinations both backends
// instantiate (Note [bf16 master weights and optimizer state] in
// optimizer.h): fp32 master and state with any gradient and output; bf16
// master, which is the parameters (no output), with fp32 or bf16 state.
template <typename F>
void visit_shard_types(const OptimizerConfig& c, const ShardBuffers& s, F&& f) {
  const std::string_view name = optimizer_name(c.kind);
  const bool fp32_master = s.master_dtype == DType::kFloat32;
  ZEST_CHECK((fp32_master && s.state_dtype == DType::kFloat32) ||
                 (s.master_dtype == DType::kBFloat16 &&
                  (s.state_dtype == DType::kFloat32 || s.state_dtype == DType::kBFloat16)),
             "{}: master weights of dtype {} with optimizer state of dtype {} are not supported (fp32 with fp32, "
             "or bf16 with fp32 or bf16)",
             name, dtype_name(s.master_dtype), dtype_name(s.state_dtype));
  ZEST_CHECK(fp32_master || s.param_out == nullptr,
             "{}: bf16 master weights are the parameters themselves: the shard must have no parameter output", name);
  visit_float_dtype(s.grad_dtype, name, "gradients", [&](auto grad_type) {
    if (!fp32_master) {
      using Bf16 = std::type_identity<bf16>;
      if (s.state_dtype == DType::kBFloat16) return f(grad_type, std::type_identity<void>{}, Bf16{}, Bf16{});
      return f(grad_type, std::type_identity<void>{}, Bf16{}, std::type_identity<float>{});
    }
    using F32 = std::type_identity<float>;
    if (s.param_out == nullptr) return f(grad_type, std::type_identity<void>{}, F32{}, F32{});
    visit_float_dtype(s.param_dtype, name, "parameters",
                      [&](auto param_type) { f(grad_type, param_type, F32{}, F32{}); });
  });
}

// On a host stream, resolves scalars.decision (host memory there) into
// grad_scale: false when the step is skipped.
bool take_host_decision(StepScalars& scalars);

void optimizer_step_host(const OptimizerConfig& config, const ShardBuffers& shard,
                         const StepScalars& scalars);

}  // namespace zest::detail
