// The synthetic task: regress the outputs of a fixed random "teacher"
// network, so the loss can go to (near) zero and runs are reproducible. Each
// (step, micro-step, rank) draws its own micro-batch from a seeded generator:
// the global batch of a step is the same whatever the world size, cut into
// per-rank pieces.
#pragma once

#include "mlp.h"

namespace mlp {

// He-style initialization from a seed: weights N(0, 2 / fan_in), biases 0.
void init_parameter(const zest::ParamLayout& param, std::span<float> values, unsigned seed);

class Teacher {
 public:
  Teacher(const Shape& shape, unsigned seed);
  // Rows [first_row, first_row + rows) of the batch of global step `step`.
  Batch batch(long step, int first_row, int rows) const;

 private:
  Shape shape_;
  unsigned seed_;
  std::vector<float> w1_;  // hidden x input
  std::vector<float> w2_;  // output x hidden
};

}  // namespace mlp
