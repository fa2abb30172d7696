// The order of one gradient-norm chunk's sum of squares, on the GPU and on
// the host: host-and-device functions, which the host tests run.
//
// Note [a warp per chunk]. One warp of 32 lanes sums a chunk, whose rows are
// its runs of 32 elements: lane l adds the squares of its elements in the
// even rows (l, l + 64, l + 128, ...) into one float and those in the odd rows
// (l + 32, l + 96, ...) into another, each in index order and each square and
// add one fused multiply-add, and its sum is the two floats' sum
// (lane_sum_of_squares). Two sums a lane halve the chain of FMAs each waits
// on, which bounded the host's loop. Then the lanes' sums, widened to double,
// meet in a shuffle tree: at offsets 16, 8, 4, 2, 1 lane l adds lane l +
// offset's value (__shfl_down_sync), and lane 0 holds the chunk's sum.
// warp_tree does the same additions on an array. The order depends on the
// chunk's values alone, not on where the chunk lies, which warp takes it or
// how many chunks there are, so the sums are independent of sharding. The
// host runs the same order (host_kernels.inc: the 32 lanes being adjacent
// elements, so one row of vector FMAs), so a chunk has the same bits on both.
//
// Note [float lanes, double fallback]. The lanes add in float because a
// double per element costs a widening each: on AVX2 the conversions alone
// took 2.3x a read of a bf16 shard, and the norm is a pass over every
// gradient at every step. A lane's float is within one rounding of 2^-24 a
// term of its exact sum, and the add of the two floats rounds once more (the
// terms are not negative, so the bounds add up): a chunk of the engine's 256
// elements (4 terms a float) is within 5 * 2^-24 = 3.0e-7 relative of its
// exact sum, the squared norm too, and the norm within half that, the
// precision of the fp32 norm DeepSpeed and PyTorch compute. Two things float
// cannot hold are summed again in double lanes, where every square of a
// float is exact (lane_sum_of_squares_double): a chunk whose float result is
// not finite (a square or a lane above 3.4e38, or an Inf or NaN gradient,
// which the double sum keeps as Inf or NaN), and one below 2^-100, where
// squares under 2^-126 lose bits as subnormals or vanish. The test
// (float_lanes_hold) reads the chunk's result alone, so the host and the GPU
// take the same branch for the same values.
#pragma once

#include <cfloat>
#include <cmath>
#include <cstddef>

#include "zest/core/platform.h"

namespace zest {

inline constexpr unsigned kNormWarp = 32;

// Note [float lanes, double fallback]: the smallest chunk sum the float
// lanes give. Squares lost below 2^-126 change a sum of at least 2^-100 by
// less than 2^-140 per element.
inline constexpr double kFloatLanesFloor = 0x1p-100;

// fma in float, one rounding, on either side: the host's vector loops use
// the same instruction, and nothing may contract or split it.
ZEST_HOST_DEVICE inline float fused_square_add(float x, float acc) {
#ifdef __CUDA_ARCH__
  return __fmaf_rn(x, x, acc);
#else
  return std::fma(x, x, acc);
#endif
}

// Lane `lane`'s part of the chunk [begin, end): load(i) is element i as a
// float; scaled in float, as the optimizer sees the gradient, then its
// square added with one rounding.
// Called with host-only loads too (the tests' reference): no device copy is
// made of those, which nvcc's check would otherwise report.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename Load>
ZEST_HOST_DEVICE float lane_sum_of_squares(const Load& load, size_t begin, size_t end, unsigned lane,
                                           float scale) {
  float even = 0.0f, odd = 0.0f;
  size_t i = begin + lane;
  for (; i + kNormWarp < end; i += 2 * kNormWarp) {
    even = fused_square_add(load(i) * scale, even);
    odd = fused_square_add(load(i + kNormWarp) * scale, odd);
  }
  if (i < end) even = fused_square_add(load(i) * scale, even);
  return even + odd;
}

// The fallback's lane: the same elements, each square exact in double.
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename Load>
ZEST_HOST_DEVICE double lane_sum_of_squares_double(const Load& load, size_t begin, size_t end, unsigned lane,
                                                   float scale) {
  double acc = 0.0;
  for (size_t i = begin + lane; i < end; i += kNormWarp) {
    const double x = static_cast<double>(load(i) * scale);
    acc += x * x;
  }
  return acc;
}

// Whether a chunk's sum from float lanes is its sum (Note [float lanes,
// double fallback]); false for NaN.
ZEST_HOST_DEVICE inline bool float_lanes_hold(double sum) { return sum >= kFloatLanesFloor && sum <= DBL_MAX; }

// The shuffle tree's additions for lane 0, on the lanes' sums (overwritten).
ZEST_HOST_DEVICE inline double warp_tree(double* lanes) {
  for (unsigned offset = kNormWarp / 2; offset > 0; offset /= 2) {
    for (unsigned l = 0; l < offset; ++l) lanes[l] += lanes[l + offset];
  }
  return lanes[0];
}

// A chunk's sum in this order, element by element: what the host's vector
// loop and the GPU's warp are tested against, and the host's loop for
// chunks it does not vectorize.
template <typename Load>
double warp_order_sum_of_squares(const Load& load, size_t begin, size_t end, float scale) {
  double lanes[kNormWarp];
  for (unsigned l = 0; l < kNormWarp; ++l) lanes[l] = lane_sum_of_squares(load, begin, end, l, scale);
  const double sum = warp_tree(lanes);
  if (float_lanes_hold(sum)) return sum;
  for (unsigned l = 0; l < kNormWarp; ++l) lanes[l] = lane_sum_of_squares_double(load, begin, end, l, scale);
  return warp_tree(lanes);
}

}  // namespace zest
