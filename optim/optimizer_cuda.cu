// CUDA implementation of the optimizer updates: one fused kernel per
// optimizer over (gradient type, parameter output type), reading the gradient
// and state once and writing master weights, state and the compute-dtype copy
// in the same pass. Each element runs optimizer_impl.h's update, the host's
// very code; with this file compiled with -fmad=false the results are the
// host's bits (Note [same bits on host and GPU] in optimizer_impl.h).
//
// 16-byte loads of eight elements per thread where the run is aligned (Note
// [16-byte vectors] in vector_lanes.h), one element per thread otherwise, in
// a grid-stride loop: consecutive threads read consecutive memory, so every
// access is coalesced; the kernel is bound by memory bandwidth (28 bytes per
// element for fp32 AdamW with an fp32 copy).
#include <type_traits>

#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/device.h"
#include "zest/optim/detail/cuda_elementwise.cuh"
#include "zest/optim/detail/optim_cuda.h"
#include "zest/optim/detail/optimizer_impl.h"
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

// kVector: Note [16-byte vectors] (vector_lanes.h), eight elements per
// step where every pointer is 16-byte aligned; otherwise one per thread.
// Each element goes through the same one-element update either way.
// TW and TS, the master and state types, are float or bf16 (Note [bf16
// master weights and optimizer state]): loads widen, stores round.
template <bool kVector, typename TG, typename TP, typename TW, typename TS>
__global__ void adam_kernel(AdamStep a, const StepDecision* decision, TW* w, TS* m, TS* v,
                            const TG* grad, TP* param_out, size_t n) {
  if (!apply_decision(decision, a.grad_scale)) return;
  const auto one = [&](size_t i) {
    float wi = load_float(w, i);
    float mi = load_float(m, i);
    float vi = load_float(v, i);
    adam_update(a, load_float(grad, i), wi, mi, vi);
    store_float(w, i, wi);
    store_float(m, i, mi);
    store_float(v, i, vi);
    if constexpr (!std::is_void_v<TP>) store_float(param_out, i, wi);
  };
  if constexpr (kVector) {
    const auto eight = [&](size_t i) {
      float g[kVecElems], wi[kVecElems], mi[kVecElems], vi[kVecElems];
      load8(grad, i, g);
      load8(w, i, wi);
      load8(m, i, mi);
      load8(v, i, vi);
      for (unsigned k = 0; k < kVecElems; ++k) adam_update(a, g[k], wi[k], mi[k], vi[k]);
      store8(w, i, wi);
      store8(m, i, mi);
      store8(v, i, vi);
      if constexpr (!std::is_void_v<TP>) store8(param_out, i, wi);
    };
    for_each_vector(n, first_index(), grid_stride(), eight, one);
  } else {
    for (size_t i = first_index(); i < n; i += grid_stride()) one(i);
  }
}

template <bool kVector, typename TG, typename TP, typename TW, typename TS>
__global__ void sgd_kernel(SgdStep s, const StepDecision* decision, TW* w, TS* buf, const TG* grad,
                           TP* param_out, size_t n) {
  if (!apply_decision(decision, s.grad_scale)) return;
  const auto one = [&](size_t i) {
    float wi = load_float(w, i);
    float bi = 0.0f;
    if (buf != nullptr && !s.first) bi = load_float(buf, i);  // the first step writes it, never reads
    sgd_update(s, load_float(grad, i), wi, buf == nullptr ? nullptr : &bi);
    store_float(w, i, wi);
    if (buf != nullptr) store_float(buf, i, bi);
    if constexpr (!std::is_void_v<TP>) store_float(param_out, i, wi);
  };
  if constexpr (kVector) {
    const auto eight = [&](size_t i) {
      float g[kVecElems], wi[kVecElems], bi[kVecElems] = {};
      load8(grad, i, g);
      load8(w, i, wi);
      if (buf != nullptr && !s.first) load8(buf, i, bi);  // the first step writes it, never reads
      for (unsigned k = 0; k < kVecElems; ++k) sgd_update(s, g[k], wi[k], buf == nullptr ? nullptr : &bi[k]);
      store8(w, i, wi);
      if (buf != nullptr) store8(buf, i, bi);
      if constexpr (!std::is_void_v<TP>) store8(param_out, i, wi);
    };
    for_each_vector(n, first_index(), grid_stride(), eight, one);
  } else {
    for (size_t i = first_index(); i < n; i += grid_stride()) one(i);
  }
}

template <typename TG, typename TP, typename TW, typename TS>
void launch(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k,
            cudaStream_t stream) {
  const auto* grad = static_cast<const TG*>(s.grad);
  auto* out = static_cast<TP*>(s.param_out);
  auto* w = static_cast<TW*>(s.master);
  auto* m = static_cast<TS*>(s.state[0]);
  auto* v = static_cast<TS*>(s.state[1]);
  if (c.kind == OptimizerKind::kSgd) {
    // Plain SGD keeps no state: state[0] may be anything, and must not be touched.
    TS* buf = c.momentum != 0.0f ? m : nullptr;
    if (vector_aligned({w, buf, grad, out})) {
      sgd_kernel<true, TG, TP, TW, TS><<<vector_blocks(s.numel), kElementwiseThreads, 0, stream>>>(
          sgd_step(c, k), k.decision, w, buf, grad, out, s.numel);
    } else {
      sgd_kernel<false, TG, TP, TW, TS><<<elementwise_blocks(s.numel), kElementwiseThreads, 0, stream>>>(
          sgd_step(c, k), k.decision, w, buf, grad, out, s.numel);
    }
  } else if (vector_aligned({w, m, v, grad, out})) {
    adam_kernel<true, TG, TP, TW, TS><<<vector_blocks(s.numel), kElementwiseThreads, 0, stream>>>(
        adam_step(c, k), k.decision, w, m, v, grad, out, s.numel);
  } else {
    adam_kernel<false, TG, TP, TW, TS><<<elementwise_blocks(s.numel), kElementwiseThreads, 0, stream>>>(
        adam_step(c, k), k.decision, w, m, v, grad, out, s.numel);
  }
  ZEST_CUDA_KERNEL_CHECK();
}

}  // namespace

void optimizer_step_cuda(const Stream& stream, const OptimizerConfig& c, const ShardBuffers& s,
                         const StepScalars& k) {
  DeviceGuard guard(stream.device());  // a kernel runs on the current device
  const auto native = cuda_stream(stream);
  visit_shard_types(c, s, [&](auto grad_type, auto param_type, auto master_type, auto state_type) {
    launch<typename decltype(grad_type)::type, typename decltype(param_type)::type,
           typename decltype(master_type)::type, typename decltype(state_type)::type>(c, s, k, native);
  });
}

}  // namespace zest::detail
