// What an optimizer step does with the global gradient norm, decided where
// the norm is: on the GPU for a CUDA stream, so the optimizer kernels queued
// behind it read the decision from device memory and the step never waits
// for the host between the norm and the update; the host reads the decision
// afterwards, for StepResult and the loss scaler. The engine queues
// decide_step over the all-reduced words, points StepScalars::decision at
// decision_at(words) for every optimizer_step of the step, and copies the
// decision to the host once the parameter gather is queued too.
//
// decide() is the one body both devices run (host code calls it, the CUDA
// kernel runs it in one thread), on doubles whose operations (sqrt, +, /)
// round correctly on both, so the host and the GPU decide alike to the bit.
#pragma once

#include <math.h>  // sqrt, callable from host and device code alike

#include <cstdint>

#include "zest/core/platform.h"
#include "zest/core/stream.h"
#include "zest/optim/exact_sum.h"

namespace zest {

struct StepDecision {
  // The square of the global norm of the unscaled gradients: exact_value of
  // the all-reduced words (Inf or NaN when a gradient was not finite).
  double sum_of_squares = 0.0;
  // What the optimizer multiplies each stored gradient by: unscale times the
  // clip coefficient, rounded once to float.
  float grad_scale = 1.0f;
  // 1: apply the step; 0: skip it (a gradient was Inf or NaN).
  int32_t finite = 1;
  int32_t clipped = 0;  // 1 when the clip coefficient was below 1
  int32_t pad = 0;
};
static_assert(sizeof(StepDecision) <= kExactWords * sizeof(int64_t),
              "a decision is written over the exact words it is decided from");

namespace detail {

ZEST_HOST_DEVICE inline bool finite_double(double v) {
  return ((exact_detail::bits_of(v) >> 52) & 0x7ff) != 0x7ff;
}

}  // namespace detail

// words: kExactWords all-reduced words of the scaled sum of squares (the
// gradients already multiplied by `unscale`, as Engine's norm does). Clipping
// as torch.nn.utils.clip_grad_norm_ and DeepSpeed: by
// max_norm / (norm + 1e-6) when that is below 1; max_norm 0 is off.
ZEST_HOST_DEVICE inline StepDecision decide(const int64_t* words, double unscale, double max_norm) {
  StepDecision d;
  d.sum_of_squares = exact_value(words);
  d.finite = detail::finite_double(d.sum_of_squares) ? 1 : 0;
  double coef = 1.0;
  if (d.finite != 0 && max_norm > 0.0) {
    const double c = max_norm / (sqrt(d.sum_of_squares) + 1e-6);
    if (c < 1.0) {
      coef = c;
      d.clipped = 1;
    }
  }
  d.grad_scale = static_cast<float>(unscale * coef);
  return d;
}

// Decides from `words` (kExactWords on the stream's device) and writes the
// decision over them (they are read first): on a host stream now, on a CUDA
// stream in a one-thread kernel queued there.
void decide_step(const Stream& stream, int64_t* words, double unscale, double max_norm);

// The decision decide_step wrote at `words`.
inline const StepDecision* decision_at(const int64_t* words) {
  return reinterpret_cast<const StepDecision*>(words);
}

}  // namespace zest
