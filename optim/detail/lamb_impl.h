// Internal: LAMB's per-element and per-parameter arithmetic behind
// optim/lamb.h, shared by the host loops (lamb_host.cpp) and the CUDA
// kernels (lamb_cuda.cu), so both perform the same float operations in the
// same order (Note [same bits on host and GPU] in optimizer_impl.h; both
// files are compiled without FMA contraction).
//
// The formula is DeepSpeed's FusedLamb (csrc/lamb/fused_lamb_cuda_kernel.cu)
// per parameter tensor:
//   g = grad * grad_scale
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g g
//   u = m / (sqrt(v) + eps) + wd w          (eps_inside_sqrt: sqrt(v + eps))
//   r = ||w|| / ||u||, clamped to [min_coeff, max_coeff]; 1 when either is 0
//   w -= (step_size * r) * u,  step_size = lr sqrt(1 - b2^t) / (1 - b1^t)
// (without bias_correction step_size = lr). Note that v is not bias
// corrected inside u: the correction is all in step_size, and the trust
// ratio compares w with that uncorrected u, as DeepSpeed does.
#pragma once

#include <math.h>  // sqrt, sqrtf: host and device alike

#include "zest/core/platform.h"
#include "zest/optim/optimizer.h"

namespace zest::detail {

// LAMB's constants of one step.
struct LambStep {
  float beta1 = 0.0f;
  float beta2 = 0.0f;
  float eps = 0.0f;
  float weight_decay = 0.0f;
  float grad_scale = 1.0f;
  float step_size = 0.0f;
  float max_coeff = 10.0f;
  float min_coeff = 0.01f;
  bool eps_inside_sqrt = false;
};

// Computed on the host for both backends, as DeepSpeed's fused_lamb_cuda
// computes them: the bias corrections in double (std::pow of float and int)
// rounded to float, then lr * sqrtf(bc2) / bc1 in float.
LambStep lamb_step(const OptimizerConfig& config, const StepScalars& scalars);

// The update direction u of an element with moments m, v (already updated).
ZEST_HOST_DEVICE inline float lamb_direction(const LambStep& l, float w, float m, float v) {
  const float denom = l.eps_inside_sqrt ? sqrtf(v + l.eps) : sqrtf(v) + l.eps;
  return m / denom + l.weight_decay * w;
}

// Pass 1 for one element: updates m and v, and returns u.
ZEST_HOST_DEVICE inline float lamb_moments_update(const LambStep& l, float grad, float w, float& m, float& v) {
  const float g = grad * l.grad_scale;
  const float mi = l.beta1 * m + (1.0f - l.beta1) * g;
  const float vi = l.beta2 * v + (1.0f - l.beta2) * g * g;
  m = mi;
  v = vi;
  return lamb_direction(l, w, mi, vi);
}

// The trust ratio of a parameter from the squares of its norms (exact sums,
// lamb.h). In double, rounded once to float, then clamped in float as
// DeepSpeed clamps; a NaN stays NaN (comparisons with it are false), as
// there.
ZEST_HOST_DEVICE inline float lamb_trust_ratio(double w_sq, double u_sq, float min_coeff, float max_coeff) {
  const double w_norm = sqrt(w_sq);
  const double u_norm = sqrt(u_sq);
  float r = 1.0f;
  if (w_norm != 0.0 && u_norm != 0.0) {
    r = static_cast<float>(w_norm / u_norm);
    if (r > max_coeff) r = max_coeff;
    if (r < min_coeff) r = min_coeff;
  }
  return r;
}

// Pass 2 for one element: `scale` is step_size * r, DeepSpeed's
// (step_size * lamb_coeff) * update.
ZEST_HOST_DEVICE inline float lamb_apply_one(const LambStep& l, float scale, float w, float m, float v) {
  return w - scale * lamb_direction(l, w, m, v);
}

}  // namespace zest::detail
