// Host implementation of the optimizer updates: one templated loop per
// optimizer over (gradient type, parameter output type), computing in float.
#include <cmath>

#include "zest/core/check.h"
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
  const bool decoupled = c.kind == OptimizerKind::kAdamW;
  const auto t = static_cast<float>(k.step);
  const float bc1 = c.bias_correction ? 1.0f - std::pow(c.beta1, t) : 1.0f;
  const float bc2 = c.bias_correction ? 1.0f - std::pow(c.beta2, t) : 1.0f;
  const float step_size = k.lr / bc1;
  const float bc2_sqrt = std::sqrt(bc2);
  const float decay = 1.0f - k.lr * k.weight_decay;
  float* w = s.master;
  float* m = s.state[0];
  float* v = s.state[1];
  for (size_t i = 0; i < s.numel; ++i) {
    float g = load<TG>(s.grad, i) * k.grad_scale;
    float wi = w[i];
    if (decoupled) {
      wi *= decay;
    } else {
      g += k.weight_decay * wi;
    }
    const float mi = c.beta1 * m[i] + (1.0f - c.beta1) * g;
    const float vi = c.beta2 * v[i] + (1.0f - c.beta2) * g * g;
    const float denom = std::sqrt(vi) / bc2_sqrt + c.eps;
    wi -= step_size * (mi / denom);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if constexpr (!std::is_void_v<TP>) store<TP>(s.param_out, i, wi);
  }
}

template <typename TG, typename TP>
void sgd_loop(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  float* w = s.master;
  float* buf = s.state[0];
  const bool first = k.step == 1;
  for (size_t i = 0; i < s.numel; ++i) {
    float g = load<TG>(s.grad, i) * k.grad_scale;
    float wi = w[i];
    g += k.weight_decay * wi;
    if (c.momentum != 0.0f) {
      const float b = first ? g : c.momentum * buf[i] + (1.0f - c.dampening) * g;
      buf[i] = b;
      g = c.nesterov ? g + c.momentum * b : b;
    }
    wi -= k.lr * g;
    w[i] = wi;
    if constexpr (!std::is_void_v<TP>) store<TP>(s.param_out, i, wi);
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

template <typename TG>
void step_with_grad(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  if (s.param_out == nullptr) return step_typed<TG, void>(c, s, k);
  switch (s.param_dtype) {
    case DType::kFloat32: return step_typed<TG, float>(c, s, k);
    case DType::kFloat16: return step_typed<TG, fp16>(c, s, k);
    case DType::kBFloat16: return step_typed<TG, bf16>(c, s, k);
    default: break;
  }
  ZEST_FAIL("{}: parameters of dtype {} are not supported (fp32, fp16 or bf16)",
            optimizer_name(c.kind), dtype_name(s.param_dtype));
}

}  // namespace

void optimizer_step_host(const OptimizerConfig& c, const ShardBuffers& s, const StepScalars& k) {
  switch (s.grad_dtype) {
    case DType::kFloat32: return step_with_grad<float>(c, s, k);
    case DType::kFloat16: return step_with_grad<fp16>(c, s, k);
    case DType::kBFloat16: return step_with_grad<bf16>(c, s, k);
    default: break;
  }
  ZEST_FAIL("{}: gradients of dtype {} are not supported (fp32, fp16 or bf16)",
            optimizer_name(c.kind), dtype_name(s.grad_dtype));
}

}  // namespace zest::detail
