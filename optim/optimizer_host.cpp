// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float
// with the element updates of optimizer_impl.h that the CUDA kernel shares.
//
// The shard is walked in blocks of kHostBlock elements, each pass over a
// block one of the loops of host_kernels.h, compiled for the widest
// instruction set the CPU has: widen the gradient into a float buffer on the
// stack, update the block, narrow the new weights into the parameter copy.
// Vector and scalar float operations round alike (every one is an IEEE
// operation; no FMA, no reassociation, as optim/CMakeLists.txt sets), so the
// bits are those of one element at a time, and of the GPU.
#include <algorithm>
#include <type_traits>

#include "zest/optim/host_convert.h"
#include "zest/optim/host_kernels.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/optimizer_impl.h"

namespace zest::detail {
namespace {

// Calls body(g, base, len) for each block, g the block's gradient as float:
// the shard's own memory when it is fp32, else widened into `scratch`.
template <typename TG, typename Body>
void for_each_block(const ShardBuffers& s, Body&& body) {
  const TG* grad = static_cast<const TG*>(s.grad);
  float scratch[kHostBlock];
  for (size_t base = 0; base < s.numel; base += kHostBlock) {
    const size_t len = std::min(kHostBlock, s.numel - base);
    const float* g = nullptr;
    if constexpr (std::is_same_v<TG, float>) {
      g = grad + base;
    } else {
      widen(grad + base, scratch, len);
      g = scratch;
    }
    body(g, base, len);
  }
}

template <typename TP>
void store_params(const ShardBuffers& s, size_t base, size_t len) {
  if constexpr (!std::is_void_v<TP>) narrow(s.master + base, static_cast<TP*>(s.param_out) + base, len);
}

template <typename TG, typename TP>
void adam_loop(const HostKernels& kern, const OptimizerConfig& c, const ShardBuffers& s,
               const StepScalars& k) {
  const AdamStep a = adam_step(c, k);
  const auto update = a.decoupled ? kern.adamw : kern.adam_l2;
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    update(a, g, s.master + base, s.state[0] + base, s.state[1] + base, len);
    store_params<TP>(s, base, len);
  });
}

template <typename TG, typename TP>
void sgd_loop(const HostKernels& kern, const OptimizerConfig& c, const ShardBuffers& s,
              const StepScalars& k) {
  const SgdStep st = sgd_step(c, k);
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    kern.sgd(st, g, s.master + base, s.state[0] == nullptr ? nullptr : s.state[0] + base, len);
    store_params<TP>(s, base, len);
  });
}

}  // namespace

void optimizer_step_host(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const HostKernels& kern = host_kernels();
  visit_shard_types(c, s, [&](auto grad_type, auto param_type) {
    using TG = typename decltype(grad_type)::type;
    using TP = typename decltype(param_type)::type;
    if (c.kind == OptimizerKind::kSgd) {
      sgd_loop<TG, TP>(kern, c, s, k);
    } else {
      adam_loop<TG, TP>(kern, c, s, k);
    }
  });
}

}  // namespace zest::detail
