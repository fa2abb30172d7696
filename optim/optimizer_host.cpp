// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float
// with the element updates of optimizer_impl.h that the CUDA kernel shares.
//
// The shard is walked in blocks of kHostBlock elements, each pass over a block a
// simple loop the compiler vectorizes: widen the gradient into a float buffer
// on the stack, update the block, narrow the new weights into the parameter
// copy (host_convert.h). Vector and scalar float operations round alike (every one is an IEEE
// operation; no FMA, no reassociation, as optim/CMakeLists.txt sets), so the
// bits are those of one element at a time, and of the GPU.
#include <algorithm>
#include <type_traits>

#include "zest/optim/host_convert.h"
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

// AdamStep by value: a local the compiler knows no store in the loop changes.
template <bool kDecoupled>
void adam_block(const AdamStep a, const float* __restrict g, float* __restrict w, float* __restrict m,
                float* __restrict v, size_t n) {
  for (size_t i = 0; i < n; ++i) adam_update_as<kDecoupled>(a, g[i], w[i], m[i], v[i]);
}

template <typename TG, typename TP>
void adam_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const AdamStep a = adam_step(c, k);
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    float* w = s.master + base;
    float* m = s.state[0] + base;
    float* v = s.state[1] + base;
    if (a.decoupled) {
      adam_block<true>(a, g, w, m, v, len);
    } else {
      adam_block<false>(a, g, w, m, v, len);
    }
    store_params<TP>(s, base, len);
  });
}

void sgd_block(const SgdStep st, const float* __restrict g, float* __restrict w, float* __restrict buf,
               size_t n) {
  for (size_t i = 0; i < n; ++i) sgd_update(st, g[i], w[i], buf == nullptr ? nullptr : buf + i);
}

template <typename TG, typename TP>
void sgd_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const SgdStep st = sgd_step(c, k);
  for_each_block<TG>(s, [&](const float* g, size_t base, size_t len) {
    sgd_block(st, g, s.master + base, s.state[0] == nullptr ? nullptr : s.state[0] + base, len);
    store_params<TP>(s, base, len);
  });
}

template <typename TG, typename TP>
void step_typed(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  if (c.kind == OptimizerKind::kSgd) {
    sgd_loop<TG, TP>(c, s, k);
  } else {
    adam_loop<TG, TP>(c, s, k);
  }
}

}  // namespace

void optimizer_step_host(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  visit_shard_types(c, s, [&](auto grad_type, auto param_type) {
    step_typed<typename decltype(grad_type)::type, typename decltype(param_type)::type>(c, s, k);
  });
}

}  // namespace zest::detail
