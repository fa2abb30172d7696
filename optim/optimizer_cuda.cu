// CUDA implementation of the optimizer updates: one fused kernel per
// optimizer over (gradient type, parameter output type), reading the gradient
// and state once and writing master weights, state and the compute-dtype copy
// in the same pass. Each element runs optimizer_impl.h's update, the host's
// very code; with this file compiled with -fmad=false the results are the
// host's bits (Note [same bits on host and GPU] in optimizer_impl.h).
//
// Scalar loads in a grid-stride loop: consecutive threads read consecutive
// elements, so every access is coalesced; the kernel is bound by memory
// bandwidth (28 bytes per element for fp32 AdamW with an fp32 copy).
#include <type_traits>

#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/device.h"
#include "zest/optim/cuda_elementwise.cuh"
#include "zest/optim/optim_cuda.h"
#include "zest/optim/optimizer_impl.h"
#include "zest/optim/step_decision.h"

namespace zest::detail {
namespace {

// StepScalars::decision, read on the device when the kernel runs: false
// (every thread returns) when the step is skipped.
__device__ inline bool apply_decision(const StepDecision* d, float& grad_scale) {
  if (d == nullptr) return true;
  if (d->finite == 0) return false;
  grad_scale = d->grad_scale;
  return true;
}

template <typename TG, typename TP>
__global__ void adam_kernel(AdamStep a, const StepDecision* decision, float* w, float* m, float* v,
                            const TG* grad, TP* param_out, size_t n) {
  if (!apply_decision(decision, a.grad_scale)) return;
  for (size_t i = first_index(); i < n; i += grid_stride()) {
    float wi = w[i];
    float mi = m[i];
    float vi = v[i];
    adam_update(a, load_float(grad, i), wi, mi, vi);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
    if constexpr (!std::is_void_v<TP>) store_float(param_out, i, wi);
  }
}

template <typename TG, typename TP>
__global__ void sgd_kernel(SgdStep s, const StepDecision* decision, float* w, float* buf, const TG* grad,
                           TP* param_out, size_t n) {
  if (!apply_decision(decision, s.grad_scale)) return;
  for (size_t i = first_index(); i < n; i += grid_stride()) {
    float wi = w[i];
    sgd_update(s, load_float(grad, i), wi, buf == nullptr ? nullptr : buf + i);
    w[i] = wi;
    if constexpr (!std::is_void_v<TP>) store_float(param_out, i, wi);
  }
}

template <typename TG, typename TP>
void launch(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k,
            cudaStream_t stream) {
  const auto* grad = static_cast<const TG*>(s.grad);
  auto* out = static_cast<TP*>(s.param_out);
  const unsigned blocks = elementwise_blocks(s.numel);
  if (c.kind == OptimizerKind::kSgd) {
    // Plain SGD keeps no state: state[0] may be anything, and must not be touched.
    float* buf = c.momentum != 0.0f ? s.state[0] : nullptr;
    sgd_kernel<TG, TP><<<blocks, kElementwiseThreads, 0, stream>>>(sgd_step(c, k), k.decision, s.master,
                                                                   buf, grad, out, s.numel);
  } else {
    adam_kernel<TG, TP><<<blocks, kElementwiseThreads, 0, stream>>>(
        adam_step(c, k), k.decision, s.master, s.state[0], s.state[1], grad, out, s.numel);
  }
  ZEST_CUDA_KERNEL_CHECK();
}

}  // namespace

void optimizer_step_cuda(const Stream& stream, const OptimizerConfig& c, const ShardBuffers& s,
                         const StepScalars& k) {
  DeviceGuard guard(stream.device());  // a kernel runs on the current device
  const auto native = cuda_stream(stream);
  visit_shard_types(c, s, [&](auto grad_type, auto param_type) {
    launch<typename decltype(grad_type)::type, typename decltype(param_type)::type>(c, s, k, native);
  });
}

}  // namespace zest::detail
