#include "zest/optim/grad_norm.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/host_queue.h"
#include "zest/optim/detail/dtype_dispatch.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/detail/host_convert.h"
#include "zest/optim/detail/host_kernels.h"
#include "zest/optim/detail/optim_cuda.h"
#include "zest/optim/step_decision.h"

namespace zest {
namespace {

// Note [a warp per chunk], the GPU's order, so the host and the GPU give a
// chunk the same bits. Whole chunks at a time: fp32 straight from the
// gradients and bf16 widened in the loop, fp16 widened first (exactly) into
// a float block of at least one chunk.
template <typename T>
void chunk_sums(const T* g, size_t numel, size_t chunk, float scale, double* out) {
  const detail::HostKernels& k = detail::host_kernels();
  if constexpr (std::is_same_v<T, float>) {
    k.chunk_squares(g, numel, chunk, scale, out);
  } else if constexpr (std::is_same_v<T, bf16>) {
    k.chunk_squares_bf16(g, numel, chunk, scale, out);
  } else {
    const size_t per = std::max<size_t>(1, detail::kHostBlock / chunk) * chunk;
    thread_local std::vector<float> block;  // reused: this runs for every unit at every step
    block.resize(std::max(block.size(), std::min(per, numel)));
    for (size_t begin = 0; begin < numel; begin += per) {
      const size_t n = std::min(per, numel - begin);
      detail::widen(g + begin, block.data(), n);
      k.chunk_squares(block.data(), n, chunk, scale, out + begin / chunk);
    }
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
  // A dtype it cannot sum is refused here, in the caller, not on a stream's thread.
  detail::visit_float_dtype(dtype, "chunk_sums_of_squares", "gradients", [](auto) {});
  host_launch(stream, [=] {
    detail::visit_float_dtype(dtype, "chunk_sums_of_squares", "gradients", [&](auto type) {
      using T = typename decltype(type)::type;
      chunk_sums(static_cast<const T*>(grad), numel, chunk_numel, scale, out);
    });
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
  host_launch(stream, [=] {
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
  });
}

void decide_step(const Stream& stream, int64_t* words, double unscale, double max_norm) {
  ZEST_CHECK(words != nullptr, "decide_step: null words");
  if (stream.device().is_cuda()) {
    detail::decide_step_cuda(stream, words, unscale, max_norm);
    return;
  }
  host_launch(stream, [=] {
    const StepDecision d = decide(words, unscale, max_norm);
    std::memcpy(words, &d, sizeof d);
  });
}

}  // namespace zest
