// How the engine averages gradients over the ranks: the factors it divides
// them by around the reduction, from DeepSpeed's prescale_gradients and
// gradient_predivide_factor.
//
// Note [gradient predivision]. DeepSpeed's all-reduce of gradients
// (runtime/engine.py allreduce_bucket at stage 0, and stage_1_and_2.py
// gradient_reduction_w_predivide at stages 1-2), with W the data-parallel
// world size and f the predivide factor:
//   prescale_gradients       g *= 1/W; sum over the ranks
//   otherwise, f != 1        g *= 1/f; sum; then g *= f/W unless f == W
// each product rounded to the gradients' dtype (torch's mul_ by a float).
// Dividing first keeps the fp16 sum of many ranks from overflowing, at the
// cost of the bits rounded off the small values. ZEST does exactly that, in
// that order, at every stage (the reduce-scatter of stages 1-3 sums the same
// values into each shard), so the stages keep their common bits. DeepSpeed
// itself refuses either key at stages 1-3 with reduce_scatter on (its
// default) and honours them there only with reduce_scatter off, whose path
// is the one above; its stage 3 without reduce-scatter divides by f and by W
// before the sum and multiplies by f after, a different rounding, which
// ZEST does not reproduce. With neither key (f == 1, no prescale) ZEST
// averages in the reduction itself (ReduceOp::kAvg: the sum divided by W,
// rounded once), as before.
#pragma once

#include "zest/comm/collective.h"
#include "zest/config/config.h"

namespace zest {

struct GradientDivision {
  float before = 1.0f;  // multiplies each rank's gradients before the reduction
  ReduceOp op = ReduceOp::kAvg;
  float after = 1.0f;   // multiplies the reduced gradients
};

inline GradientDivision gradient_division(const EngineConfig& config, int world_size) {
  const auto w = static_cast<double>(world_size);
  const double f = config.gradient_predivide_factor;
  GradientDivision d;
  if (config.prescale_gradients) {
    d.before = static_cast<float>(1.0 / w);
    d.op = ReduceOp::kSum;
  } else if (f != 1.0) {
    d.before = static_cast<float>(1.0 / f);
    d.op = ReduceOp::kSum;
    if (f != w) d.after = static_cast<float>(f / w);
  }
  return d;
}

}  // namespace zest
