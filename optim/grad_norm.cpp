#include "zest/optim/grad_norm.h"

#include <algorithm>

#include "zest/core/check.h"
#include "zest/optim/dtype_dispatch.h"
#include "zest/optim/optim_cuda.h"

namespace zest {
namespace {

template <typename T>
void chunk_sums(const T* g, size_t numel, size_t chunk, float scale, double* out) {
  const size_t chunks = (numel + chunk - 1) / chunk;
  for (size_t c = 0; c < chunks; ++c) {
    const size_t end = std::min(numel, (c + 1) * chunk);
    double acc = 0.0;
    for (size_t i = c * chunk; i < end; ++i) {
      // Scaled in float, as the optimizer sees the gradient, then squared
      // exactly in double.
      const double x = static_cast<double>(static_cast<float>(g[i]) * scale);
      acc += x * x;
    }
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

}  // namespace zest
