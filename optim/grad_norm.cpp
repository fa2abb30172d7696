#include "zest/optim/grad_norm.h"

#include <algorithm>
#include <cstring>

#include "zest/core/check.h"
#include "zest/optim/dtype_dispatch.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/optim_cuda.h"
#include "zest/optim/step_decision.h"

namespace zest {
namespace {

// Scaled in float, as the optimizer sees the gradient, then squared exactly
// in double.
template <typename T>
double scaled_square(const T& v, float scale) {
  const double x = static_cast<double>(static_cast<float>(v) * scale);
  return x * x;
}

template <typename T>
void chunk_sums(const T* g, size_t numel, size_t chunk, float scale, double* out) {
  const size_t chunks = (numel + chunk - 1) / chunk;
  // Eight whole chunks at a time, each still added in its own index order (so
  // the same bits): eight independent chains of additions instead of one,
  // which a single chain's latency would otherwise bound.
  constexpr size_t kLanes = 8;
  size_t c = 0;
  for (; c + kLanes <= numel / chunk; c += kLanes) {
    double acc[kLanes] = {};
    const T* base = g + c * chunk;
    for (size_t i = 0; i < chunk; ++i) {
      for (size_t k = 0; k < kLanes; ++k) acc[k] += scaled_square(base[k * chunk + i], scale);
    }
    for (size_t k = 0; k < kLanes; ++k) out[c + k] = acc[k];
  }
  for (; c < chunks; ++c) {
    const size_t end = std::min(numel, (c + 1) * chunk);
    double acc = 0.0;
    for (size_t i = c * chunk; i < end; ++i) acc += scaled_square(g[i], scale);
    out[c] = acc;
  }
}

}  // namespace

void chunk_sums_of_squares(const Stream& stream, const void* grad, DType dtype, size_t numel,
                           size_t chunk_numel, float scale, double* out) {
  ZEST_CHECK(chunk_numel > 0, "chunk_sums_of_squares: chunk_numel must be positive");
  if (numel == 0) return;
  ZEST_CHECK(grad != nullptr && out != nullptr, "chunk_sums_of_squares: null buffer");
  if (stream.device().is_cuda()) {
    detail::chunk_sums_of_squares_cuda(stream, grad, dtype, numel, chunk_numel, scale, out);
    return;
  }
  detail::visit_float_dtype(dtype, "chunk_sums_of_squares", "gradients", [&](auto type) {
    using T = typename decltype(type)::type;
    chunk_sums(static_cast<const T*>(grad), numel, chunk_numel, scale, out);
  });
}

double sum_in_order(const double* sums, size_t count) {
  double total = 0.0;
  for (size_t i = 0; i < count; ++i) total += sums[i];
  return total;
}

void accumulate_exact(const Stream& stream, const double* sums, size_t count, int64_t* acc) {
  ZEST_CHECK(acc != nullptr && (count == 0 || sums != nullptr), "accumulate_exact: null buffer");
  if (stream.device().is_cuda()) {
    detail::accumulate_exact_cuda(stream, sums, count, acc);
    return;
  }
  exact_normalize(acc);
  // 2^31 adds fit between normalizations (exact_sum.h); 2^24 is a margin.
  constexpr size_t kBetweenNormalizations = size_t{1} << 24;
  for (size_t i = 0; i < count; ++i) {
    ZEST_CHECK(exact_add(acc, sums[i]),
               "accumulate_exact: chunk sum {} at {} is not a sum of squares of floats (negative, or "
               "not a multiple of 2^-298 below 2^320): pass what chunk_sums_of_squares wrote",
               sums[i], i);
    if ((i + 1) % kBetweenNormalizations == 0) exact_normalize(acc);
  }
  exact_normalize(acc);
}

void decide_step(const Stream& stream, int64_t* words, double unscale, double max_norm) {
  ZEST_CHECK(words != nullptr, "decide_step: null words");
  if (stream.device().is_cuda()) {
    detail::decide_step_cuda(stream, words, unscale, max_norm);
    return;
  }
  const StepDecision d = decide(words, unscale, max_norm);
  std::memcpy(words, &d, sizeof d);
}

}  // namespace zest
