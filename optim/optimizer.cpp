#include "zest/optim/optimizer.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "zest/core/check.h"
#include "zest/optim/detail/lamb_impl.h"
#include "zest/optim/detail/optim_cuda.h"
#include "zest/optim/detail/optimizer_impl.h"
#include "zest/optim/step_decision.h"

namespace zest {

std::string_view optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kAdamW: return "AdamW";
    case OptimizerKind::kAdam: return "Adam";
    case OptimizerKind::kSgd: return "SGD";
    case OptimizerKind::kLamb: return "Lamb";
  }
  return "unknown";
}

void OptimizerConfig::validate() const {
  const std::string_view name = optimizer_name(kind);
  ZEST_CHECK(host_threads >= 1 && host_threads <= 1024,
             "{}: host_threads must be 1 to 1024, got {}; 1 (the default) suits a rank per core",
             name, host_threads);
  ZEST_CHECK(std::isfinite(lr) && lr >= 0, "{}: lr must be a finite number >= 0, got {}", name, lr);
  ZEST_CHECK(std::isfinite(weight_decay) && weight_decay >= 0,
             "{}: weight_decay must be a finite number >= 0, got {}", name, weight_decay);
  if (kind == OptimizerKind::kSgd) {
    ZEST_CHECK(momentum >= 0 && momentum < 1, "SGD: momentum must be in [0, 1), got {}", momentum);
    ZEST_CHECK(dampening >= 0 && dampening <= 1, "SGD: dampening must be in [0, 1], got {}", dampening);
    ZEST_CHECK(!nesterov || (momentum > 0 && dampening == 0),
               "SGD: nesterov needs momentum > 0 and dampening 0 (got momentum {}, dampening {})",
               momentum, dampening);
    return;
  }
  ZEST_CHECK(beta1 >= 0 && beta1 < 1, "{}: betas[0] must be in [0, 1), got {}", name, beta1);
  ZEST_CHECK(beta2 >= 0 && beta2 < 1, "{}: betas[1] must be in [0, 1), got {}", name, beta2);
  ZEST_CHECK(std::isfinite(eps) && eps > 0, "{}: eps must be a positive number, got {}", name, eps);
  if (kind != OptimizerKind::kLamb) return;
  ZEST_CHECK(std::isfinite(min_coeff) && min_coeff > 0,
             "Lamb: min_coeff must be a positive number, got {} (DeepSpeed's default is 0.01)", min_coeff);
  ZEST_CHECK(std::isfinite(max_coeff) && max_coeff >= min_coeff,
             "Lamb: max_coeff must be a finite number >= min_coeff ({}), got {} (DeepSpeed's default is 10)",
             min_coeff, max_coeff);
}

int OptimizerConfig::state_buffers() const {
  if (kind == OptimizerKind::kSgd) return momentum != 0.0f ? 1 : 0;
  return 2;
}

void check_learning_rate(const OptimizerConfig& config, double lr, float max_weight_decay,
                         std::string_view source) {
  const std::string_view name = optimizer_name(config.kind);
  ZEST_CHECK(std::isfinite(lr) && lr >= 0.0, "{}: the learning rate from {} is {}; it must be finite and 0 or more",
             name, source, lr);
  const auto lr32 = static_cast<float>(lr);
  ZEST_CHECK(std::isfinite(lr32),
             "{}: the learning rate from {} is {}, past fp32's range (at most {}), in which the optimizer computes; "
             "no weight was changed",
             name, source, lr, std::numeric_limits<float>::max());
  StepScalars first;
  first.lr = lr32;
  first.weight_decay = max_weight_decay;
  const float lr_decay = lr32 * max_weight_decay;
  ZEST_CHECK(std::isfinite(lr_decay),
             "{}: the learning rate from {} is {}: times the weight_decay {} it overflows fp32, which would "
             "turn the weights into Inf; no weight was changed",
             name, source, lr, max_weight_decay);
  if (config.kind == OptimizerKind::kSgd) return;
  if (config.kind == OptimizerKind::kLamb) {
    const detail::LambStep l = detail::lamb_step(config, first);
    ZEST_CHECK(std::isfinite(l.step_size) && std::isfinite(l.step_size * config.max_coeff),
               "{}: the learning rate from {} is {}: with the bias correction of the first step and max_coeff {} "
               "it overflows fp32 ({}), which would turn the weights into Inf; no weight was changed",
               name, source, lr, config.max_coeff, l.step_size * config.max_coeff);
    return;
  }
  const detail::AdamStep a = detail::adam_step(config, first);
  ZEST_CHECK(std::isfinite(a.step_size),
             "{}: the learning rate from {} is {}: divided by the bias correction 1 - beta1 ({}) of the first step "
             "it overflows fp32 ({}), which would turn the weights into Inf; no weight was changed",
             name, source, lr, config.beta1, a.step_size);
}

ShardBuffers ShardBuffers::part(size_t begin, size_t n) const {
  ZEST_INTERNAL_ASSERT(begin <= numel && n <= numel - begin, "part [{}, +{}) of a shard of {}", begin, n, numel);
  ShardBuffers p = *this;
  p.master = static_cast<char*>(master) + begin * elem_size(master_dtype);
  for (void*& st : p.state) {
    if (st != nullptr) st = static_cast<char*>(st) + begin * elem_size(state_dtype);
  }
  p.grad = static_cast<const char*>(grad) + begin * elem_size(grad_dtype);
  if (param_out != nullptr) p.param_out = static_cast<char*>(param_out) + begin * elem_size(param_dtype);
  p.numel = n;
  return p;
}

float* ShardBuffers::master_fp32(std::string_view op) const {
  ZEST_CHECK(master_dtype == DType::kFloat32, "{}: master weights of dtype {} are not supported (fp32 only)", op,
             dtype_name(master_dtype));
  return static_cast<float*>(master);
}

float* ShardBuffers::state_fp32(int i, std::string_view op) const {
  ZEST_CHECK(state_dtype == DType::kFloat32, "{}: optimizer state of dtype {} is not supported (fp32 only)", op,
             dtype_name(state_dtype));
  return static_cast<float*>(state[i]);
}

void optimizer_step(const Stream& stream, const OptimizerConfig& config, const ShardBuffers& shard,
                    const StepScalars& scalars) {
  ZEST_CHECK(scalars.step >= 1, "{}: step must count from 1, got {}", optimizer_name(config.kind),
             scalars.step);
  ZEST_CHECK(config.kind != OptimizerKind::kLamb,
             "optimizer_step: Lamb's trust ratio needs the norms of whole parameters, which one shard does not "
             "have; step it with lamb_moments, lamb_accumulate, lamb_trust_ratios and lamb_apply (optim/lamb.h)");
  if (shard.numel == 0) return;
  ZEST_CHECK(shard.master != nullptr && shard.grad != nullptr,
             "{}: master weights and gradient must not be null", optimizer_name(config.kind));
  for (int i = 0; i < config.state_buffers(); ++i) {
    ZEST_CHECK(shard.state[i] != nullptr, "{}: state buffer {} must not be null",
               optimizer_name(config.kind), i);
  }
  if (stream.device().is_host()) {
    StepScalars k = scalars;
    if (!detail::take_host_decision(k)) return;
    detail::optimizer_step_host(config, shard, k);
  } else {
    detail::optimizer_step_cuda(stream, config, shard, scalars);
  }
}

namespace detail {

bool take_host_decision(StepScalars& k) {
  if (k.decision == nullptr) return true;
  StepDecision d;
  std::memcpy(&d, k.decision, sizeof d);  // decide_step wrote its bytes
  if (d.finite == 0) return false;
  k.grad_scale = d.grad_scale;
  k.decision = nullptr;
  return true;
}

// Both backends take their per-step constants from here, computed on the
// host (Note [same bits on host and GPU] in optimizer_impl.h).
AdamStep adam_step(const OptimizerConfig& c, const StepScalars& k) {
  const auto t = static_cast<float>(k.step);
  const float bc1 = c.bias_correction ? 1.0f - std::pow(c.beta1, t) : 1.0f;
  const float bc2 = c.bias_correction ? 1.0f - std::pow(c.beta2, t) : 1.0f;
  AdamStep a;
  a.decoupled = c.kind == OptimizerKind::kAdamW;
  a.beta1 = c.beta1;
  a.beta2 = c.beta2;
  a.eps = c.eps;
  a.weight_decay = k.weight_decay;
  a.grad_scale = k.grad_scale;
  a.step_size = k.lr / bc1;
  a.bc2_sqrt = std::sqrt(bc2);
  a.decay = 1.0f - k.lr * k.weight_decay;
  return a;
}

LambStep lamb_step(const OptimizerConfig& c, const StepScalars& k) {
  LambStep l;
  l.beta1 = c.beta1;
  l.beta2 = c.beta2;
  l.eps = c.eps;
  l.weight_decay = k.weight_decay;
  l.grad_scale = k.grad_scale;
  l.max_coeff = c.max_coeff;
  l.min_coeff = c.min_coeff;
  l.eps_inside_sqrt = c.eps_inside_sqrt;
  l.step_size = k.lr;
  if (c.bias_correction) {
    const auto bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), static_cast<double>(k.step)));
    const auto bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), static_cast<double>(k.step)));
    l.step_size = k.lr * std::sqrt(bc2) / bc1;
  }
  return l;
}

SgdStep sgd_step(const OptimizerConfig& c, const StepScalars& k) {
  SgdStep s;
  s.lr = k.lr;
  s.weight_decay = k.weight_decay;
  s.grad_scale = k.grad_scale;
  s.momentum = c.momentum;
  s.dampening = c.dampening;
  s.nesterov = c.nesterov;
  s.first = k.step == 1;
  return s;
}

}  // namespace detail

}  // namespace zest
