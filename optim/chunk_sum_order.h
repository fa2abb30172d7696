// The order of one gradient-norm chunk's sum of squares, on the GPU and on
// the host: host-and-device functions, which the host tests run.
//
// Note [a warp per chunk]. One warp of 32 lanes sums a chunk: lane l adds the
// squares of elements l, l + 32, l + 64, ... of the chunk in index order, in
// double (lane_sum_of_squares); then the lanes' sums meet in a shuffle tree:
// at offsets 16, 8, 4, 2, 1 lane l adds lane l + offset's value
// (__shfl_down_sync), and lane 0 holds the chunk's sum. warp_tree does the
// same additions on an array. The order depends on the chunk's values alone,
// not on where the chunk lies, which warp takes it or how many chunks there
// are, so the sums are independent of sharding. The host runs the same order
// (host_kernels.inc: chunk_squares, the 32 lanes being adjacent elements, so
// one row of vector adds), so a chunk has the same bits on both.
#pragma once

#include <cstddef>

#include "zest/core/platform.h"

namespace zest {

inline constexpr unsigned kNormWarp = 32;

// Lane `lane`'s part of the chunk [begin, end): load(i) is element i as a
// float; scaled in float, as the optimizer sees the gradient, then squared
// exactly in double.
template <typename Load>
ZEST_HOST_DEVICE double lane_sum_of_squares(const Load& load, size_t begin, size_t end, unsigned lane,
                                            float scale) {
  double acc = 0.0;
  for (size_t i = begin + lane; i < end; i += kNormWarp) {
    const double x = static_cast<double>(load(i) * scale);
    acc += x * x;
  }
  return acc;
}

// The shuffle tree's additions for lane 0, on the lanes' sums (overwritten).
ZEST_HOST_DEVICE inline double warp_tree(double* lanes) {
  for (unsigned offset = kNormWarp / 2; offset > 0; offset /= 2) {
    for (unsigned l = 0; l < offset; ++l) lanes[l] += lanes[l + offset];
  }
  return lanes[0];
}

// A chunk's sum in this order, element by element: what the host's vector
// loop and the GPU's warp are tested against.
template <typename Load>
double warp_order_sum_of_squares(const Load& load, size_t begin, size_t end, float scale) {
  double lanes[kNormWarp];
  for (unsigned l = 0; l < kNormWarp; ++l) lanes[l] = lane_sum_of_squares(load, begin, end, l, scale);
  return warp_tree(lanes);
}

}  // namespace zest
