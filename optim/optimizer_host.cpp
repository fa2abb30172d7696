// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float
// with the element updates of optimizer_impl.h that the CUDA kernel shares.
#include <type_traits>

#include "zest/optim/optimizer.h"
#include "zest/optim/optimizer_impl.h"

namespace zest::detail {
namespace {

template <typename T>
float load(const void* p, size_t i) {
  return static_cast<float>(static_cast<const T*>(p)[i]);
}

template <typename T>
void store(void* p, size_t i, float v) {
  static_cast<T*>(p)[i] = T(v);
}

template <typename TG, typename TP>
void adam_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const AdamStep a = adam_step(c, k);
  float* w = s.master;
  float* m = s.state[0];
  float* v = s.state[1];
  for (size_t i = 0; i < s.numel; ++i) {
    adam_update(a, load<TG>(s.grad, i), w[i], m[i], v[i]);
    if constexpr (!std::is_void_v<TP>) store<TP>(s.param_out, i, w[i]);
  }
}

template <typename TG, typename TP>
void sgd_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  const SgdStep st = sgd_step(c, k);
  float* w = s.master;
  float* buf = s.state[0];
  for (size_t i = 0; i < s.numel; ++i) {
    sgd_update(st, load<TG>(s.grad, i), w[i], buf == nullptr ? nullptr : buf + i);
    if constexpr (!std::is_void_v<TP>) store<TP>(s.param_out, i, w[i]);
  }
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
