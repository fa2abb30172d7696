#include "zest/optim/grad_norm.h"

#include <algorithm>

#include "zest/core/check.h"

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
  ZEST_CHECK(stream.device().is_host(),
             "chunk_sums_of_squares on {}: the CUDA kernel is not part of this build yet",
             stream.device().str());
  switch (dtype) {
    case DType::kFloat32: return chunk_sums(static_cast<const float*>(grad), numel, chunk_numel, scale, out);
    case DType::kFloat16: return chunk_sums(static_cast<const fp16*>(grad), numel, chunk_numel, scale, out);
    case DType::kBFloat16: return chunk_sums(static_cast<const bf16*>(grad), numel, chunk_numel, scale, out);
    default: break;
  }
  ZEST_FAIL("chunk_sums_of_squares: gradients of dtype {} are not supported (fp32, fp16 or bf16)",
            dtype_name(dtype));
}

double sum_in_order(const double* sums, size_t count) {
  double total = 0.0;
  for (size_t i = 0; i < count; ++i) total += sums[i];
  return total;
}

}  // namespace zest
