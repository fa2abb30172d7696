// CUDA implementation of LAMB's step (lamb.h): a warp per piece for both
// passes, the lanes walking the piece as Note [a warp per chunk]'s double
// lanes do (chunk_sum_order.h, lamb.h), so a piece's sums of w^2 and u^2 are
// the host's bits; every element runs lamb_impl.h's functions, the host's
// very code, and this file is compiled with -fmad=false (optim/
// CMakeLists.txt), so the moments and weights are the host's bits too (Note
// [same bits on host and GPU] in optimizer_impl.h).
//
// The exact sums: a thread per piece adds its two sums into words of its own
// (exact_add), then adds those words into the parameter's with 64-bit
// atomics. Integer additions, so the order changes no bit; a second kernel
// normalizes each parameter's words, which then equal the host's.
#include <algorithm>
#include <type_traits>

#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/device.h"
#include "zest/optim/chunk_sum_order.h"
#include "zest/optim/detail/cuda_elementwise.cuh"
#include "zest/optim/exact_sum.h"
#include "zest/optim/detail/lamb_impl.h"
#include "zest/optim/detail/optim_cuda.h"
#include "zest/optim/detail/optimizer_impl.h"
#include "zest/optim/step_decision.h"

namespace zest::detail {
namespace {

constexpr unsigned kLambWarpsPerBlock = 8;
constexpr unsigned kLambThreads = 256;

// Blocks for one warp per piece, capped; past the cap warps loop over
// pieces, which changes no piece's result.
unsigned piece_blocks(size_t count) {
  constexpr size_t kMaxBlocks = size_t{1} << 16;
  return static_cast<unsigned>(std::min((count + kLambWarpsPerBlock - 1) / kLambWarpsPerBlock, kMaxBlocks));
}

// StepScalars::decision on the device: false when the step is skipped.
__device__ inline bool take_decision(const StepDecision* d, float& grad_scale) {
  if (d == nullptr) return true;
  if (d->finite == 0) return false;
  grad_scale = d->grad_scale;
  return true;
}

template <typename TG>
__global__ void lamb_moments_kernel(LambStep l, const StepDecision* decision, float* w, float* m, float* v,
                                    const TG* grad, const LambPiece* pieces, size_t count, double* sums) {
  if (!take_decision(decision, l.grad_scale)) return;
  const unsigned lane = threadIdx.x % kNormWarp;
  const size_t stride = static_cast<size_t>(gridDim.x) * kLambWarpsPerBlock;
  // p depends on the warp alone, so every lane of a warp runs the same
  // iterations and the full-mask shuffles are well-defined.
  for (size_t p = static_cast<size_t>(blockIdx.x) * kLambWarpsPerBlock + threadIdx.x / kNormWarp; p < count;
       p += stride) {
    const LambPiece piece = pieces[p];
    double w_acc = 0.0;
    double u_acc = 0.0;
    for (size_t j = lane; j < piece.numel; j += kNormWarp) {
      const size_t i = piece.begin + j;
      const float wi = w[i];
      float mi = m[i];
      float vi = v[i];
      const float u = lamb_moments_update(l, load_float(grad, i), wi, mi, vi);
      m[i] = mi;
      v[i] = vi;
      const auto wd = static_cast<double>(wi);
      const auto ud = static_cast<double>(u);
      w_acc += wd * wd;  // exact squares: an FMA here would change nothing
      u_acc += ud * ud;
    }
    for (unsigned offset = kNormWarp / 2; offset > 0; offset /= 2) {
      w_acc += __shfl_down_sync(0xffffffffu, w_acc, offset);  // warp_tree's additions
      u_acc += __shfl_down_sync(0xffffffffu, u_acc, offset);
    }
    if (lane == 0) {
      sums[2 * p] = w_acc;
      sums[2 * p + 1] = u_acc;
    }
  }
}

__global__ void lamb_accumulate_kernel(const LambPiece* pieces, const double* sums, size_t count,
                                       int64_t* words) {
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const size_t p = pieces[i].param;
    for (size_t k = 0; k < 2; ++k) {
      int64_t mine[kExactWords] = {};
      // Outside exact_add's range only if a sum were not one of squares:
      // counted as a NaN, so the ratio is NaN rather than wrong.
      if (!exact_add(mine, sums[2 * i + k])) ++mine[kExactNaNWord];
      int64_t* into = words + (2 * p + k) * kExactWords;
      for (int q = 0; q < kExactWords; ++q) {
        if (mine[q] != 0) {
          atomicAdd(reinterpret_cast<unsigned long long*>(into + q), static_cast<unsigned long long>(mine[q]));
        }
      }
    }
  }
}

__global__ void lamb_normalize_kernel(int64_t* words, size_t sums) {
  for (size_t s = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; s < sums;
       s += static_cast<size_t>(gridDim.x) * blockDim.x) {
    exact_normalize(words + s * kExactWords);
  }
}

__global__ void lamb_ratios_kernel(const int64_t* words, size_t params, float min_coeff, float max_coeff,
                                   float* ratios) {
  for (size_t p = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < params;
       p += static_cast<size_t>(gridDim.x) * blockDim.x) {
    ratios[p] = lamb_trust_ratio(exact_value(words + 2 * p * kExactWords),
                                 exact_value(words + (2 * p + 1) * kExactWords), min_coeff, max_coeff);
  }
}

template <typename TP>
__global__ void lamb_apply_kernel(LambStep l, const StepDecision* decision, float* w, const float* m,
                                  const float* v, TP* param_out, const LambPiece* pieces, size_t count,
                                  const float* ratios) {
  if (!take_decision(decision, l.grad_scale)) return;
  const unsigned lane = threadIdx.x % kNormWarp;
  const size_t stride = static_cast<size_t>(gridDim.x) * kLambWarpsPerBlock;
  for (size_t p = static_cast<size_t>(blockIdx.x) * kLambWarpsPerBlock + threadIdx.x / kNormWarp; p < count;
       p += stride) {
    const LambPiece piece = pieces[p];
    const float scale = l.step_size * ratios[piece.param];
    for (size_t j = lane; j < piece.numel; j += kNormWarp) {
      const size_t i = piece.begin + j;
      const float wi = lamb_apply_one(l, scale, w[i], m[i], v[i]);
      w[i] = wi;
      if constexpr (!std::is_void_v<TP>) store_float(param_out, i, wi);
    }
  }
}

// Blocks of kLambThreads for a thread per item, capped like the others.
unsigned item_blocks(size_t n) {
  constexpr size_t kMaxBlocks = 4096;
  return static_cast<unsigned>(std::min(kMaxBlocks, (n + kLambThreads - 1) / kLambThreads));
}

}  // namespace

void lamb_moments_cuda(const Stream& stream, const LambStep& step, const StepDecision* decision,
                       const ShardBuffers& s, const LambPiece* pieces, size_t count, double* sums) {
  DeviceGuard guard(stream.device());  // a kernel runs on the current device
  const auto native = cuda_stream(stream);
  visit_float_dtype(s.grad_dtype, "Lamb", "gradients", [&](auto grad_type) {
    using TG = typename decltype(grad_type)::type;
    lamb_moments_kernel<TG><<<piece_blocks(count), kLambWarpsPerBlock * kNormWarp, 0, native>>>(
        step, decision, s.master_fp32("Lamb"), s.state_fp32(0, "Lamb"), s.state_fp32(1, "Lamb"),
        static_cast<const TG*>(s.grad), pieces, count, sums);
    ZEST_CUDA_KERNEL_CHECK();
  });
}

void lamb_accumulate_cuda(const Stream& stream, const LambPiece* pieces, const double* sums, size_t count,
                          size_t params, int64_t* words) {
  DeviceGuard guard(stream.device());
  const auto native = cuda_stream(stream);
  if (count > 0) {
    lamb_accumulate_kernel<<<item_blocks(count), kLambThreads, 0, native>>>(pieces, sums, count, words);
    ZEST_CUDA_KERNEL_CHECK();
  }
  // Each word rose by less than count * 2^32 < 2^63 (count < 2^31 pieces);
  // normalized, the ranks' words may be all-reduced (exact_sum.h).
  lamb_normalize_kernel<<<item_blocks(2 * params), kLambThreads, 0, native>>>(words, 2 * params);
  ZEST_CUDA_KERNEL_CHECK();
}

void lamb_trust_ratios_cuda(const Stream& stream, const int64_t* words, size_t params, float min_coeff,
                            float max_coeff, float* ratios) {
  DeviceGuard guard(stream.device());
  lamb_ratios_kernel<<<item_blocks(params), kLambThreads, 0, cuda_stream(stream)>>>(words, params, min_coeff,
                                                                                      max_coeff, ratios);
  ZEST_CUDA_KERNEL_CHECK();
}

void lamb_apply_cuda(const Stream& stream, const LambStep& step, const StepDecision* decision,
                     const ShardBuffers& s, const LambPiece* pieces, size_t count, const float* ratios) {
  DeviceGuard guard(stream.device());
  const auto native = cuda_stream(stream);
  const auto launch = [&](auto* out) {
    using TP = std::remove_pointer_t<decltype(out)>;
    lamb_apply_kernel<TP><<<piece_blocks(count), kLambWarpsPerBlock * kNormWarp, 0, native>>>(
        step, decision, s.master_fp32("Lamb"), s.state_fp32(0, "Lamb"), s.state_fp32(1, "Lamb"), out, pieces, count, ratios);
    ZEST_CUDA_KERNEL_CHECK();
  };
  if (s.param_out == nullptr) return launch(static_cast<void*>(nullptr));  // TP void: no copy
  visit_float_dtype(s.param_dtype, "Lamb", "parameters",
                    [&](auto param_type) { launch(static_cast<typename decltype(param_type)::type*>(s.param_out)); });
}

}  // namespace zest::detail
