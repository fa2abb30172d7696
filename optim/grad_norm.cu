// CUDA implementation of chunk_sums_of_squares: one warp per chunk, in the
// order of Note [a warp per chunk] (optim/chunk_sum_order.h), whose
// host-and-device functions the host tests run too; the host's loop
// (host_kernels.inc) adds in the same order, so the two give the same bits
// (tests/cuda/test_cuda_optim.cu checks them against
// warp_order_sum_of_squares). The lanes' FMAs are written out
// (fused_square_add) and the double fallback's squares are exact, so no
// contraction the compiler might do changes a bit: this file needs no
// -fmad=false.
#include <algorithm>

#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#include "zest/core/device.h"
#include "zest/optim/chunk_sum_order.h"
#include "zest/optim/detail/cuda_elementwise.cuh"
#include "zest/optim/detail/dtype_dispatch.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/exact_sum_grid.h"
#include "zest/optim/detail/optim_cuda.h"
#include "zest/optim/step_decision.h"

namespace zest::detail {
namespace {

constexpr unsigned kWarpsPerBlock = 8;

// warp_tree's additions across the warp's lanes: lane 0 gets the sum.
__device__ double warp_tree_sum(double acc) {
  for (unsigned offset = kNormWarp / 2; offset > 0; offset /= 2) acc += __shfl_down_sync(0xffffffffu, acc, offset);
  return acc;
}

template <typename T>
__global__ void chunk_sums_kernel(const T* g, size_t numel, size_t chunk, size_t chunks, float scale,
                                  double* out) {
  const unsigned lane = threadIdx.x % kNormWarp;
  const size_t stride = static_cast<size_t>(gridDim.x) * kWarpsPerBlock;
  const auto load = [g](size_t i) { return load_float(g, i); };
  // c depends on the warp alone, so every lane of a warp runs the same
  // iterations and the full-mask shuffles are well-defined.
  for (size_t c = static_cast<size_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kNormWarp; c < chunks;
       c += stride) {
    const size_t begin = c * chunk;
    const size_t end = numel - begin < chunk ? numel : begin + chunk;  // the last may be short
    double acc = warp_tree_sum(lane_sum_of_squares(load, begin, end, lane, scale));
    // Note [float lanes, double fallback]: lane 0's sum decides for the
    // whole warp, so the shuffles of the fallback's tree see every lane.
    if (!float_lanes_hold(__shfl_sync(0xffffffffu, acc, 0))) {
      acc = warp_tree_sum(lane_sum_of_squares_double(load, begin, end, lane, scale));
    }
    if (lane == 0) out[c] = acc;
  }
}

// Note [exact sum on a grid] (optim/exact_sum_grid.h): each block adds its
// strided share of the chunk sums exactly, merges its threads' words in a
// tree and adds them into acc with integer atomics; normalize_exact_kernel
// then normalizes acc. Integer additions throughout, so the grid and the
// order of the atomics change no bit: the host's accumulate_exact to the bit
// (accumulate_exact_grid_model is this, on the host).
__global__ void accumulate_exact_kernel(const double* sums, size_t count, int64_t* acc) {
  __shared__ int64_t words[kExactThreads][kExactWords];
  const unsigned t = threadIdx.x;
  int64_t* mine = words[t];
  for (int k = 0; k < kExactWords; ++k) mine[k] = 0;
  exact_add_strided(mine, sums, count, static_cast<size_t>(blockIdx.x) * kExactThreads + t,
                    static_cast<size_t>(gridDim.x) * kExactThreads);
  __syncthreads();
  for (unsigned half = kExactThreads / 2; half > 0; half /= 2) {
    if (t < half) exact_merge(words[t], words[t + half]);
    __syncthreads();
  }
  static_assert(kExactWords <= kExactThreads, "one thread per word of the block's sum");
  if (t < static_cast<unsigned>(kExactWords) && words[0][t] != 0) {
    // Two's complement: an unsigned add is the signed one.
    atomicAdd(reinterpret_cast<unsigned long long*>(acc + t), static_cast<unsigned long long>(words[0][t]));
  }
}

__global__ void normalize_exact_kernel(int64_t* acc) { exact_normalize(acc); }

// One thread: decide() reads every word into its own locals before the
// decision is stored over them.
__global__ void decide_step_kernel(int64_t* words, double unscale, double max_norm) {
  const StepDecision d = decide(words, unscale, max_norm);
  *reinterpret_cast<StepDecision*>(words) = d;
}

}  // namespace

void decide_step_cuda(const Stream& stream, int64_t* words, double unscale, double max_norm) {
  DeviceGuard guard(stream.device());
  decide_step_kernel<<<1, 1, 0, cuda_stream(stream)>>>(words, unscale, max_norm);
  ZEST_CUDA_KERNEL_CHECK();
}

void accumulate_exact_cuda(const Stream& stream, const double* sums, size_t count, int64_t* acc) {
  DeviceGuard guard(stream.device());
  const auto native = cuda_stream(stream);
  accumulate_exact_kernel<<<exact_grid_blocks(count), kExactThreads, 0, native>>>(sums, count, acc);
  ZEST_CUDA_KERNEL_CHECK();
  normalize_exact_kernel<<<1, 1, 0, native>>>(acc);
  ZEST_CUDA_KERNEL_CHECK();
}

void chunk_sums_of_squares_cuda(const Stream& stream, const void* grad, DType dtype, size_t numel,
                                size_t chunk_numel, float scale, double* out) {
  const size_t chunks = numel / chunk_numel + (numel % chunk_numel != 0 ? 1 : 0);
  // One warp per chunk up to a cap well past what a GPU runs at once; beyond
  // it warps loop over chunks, which leaves every chunk's sum unchanged.
  constexpr size_t kMaxBlocks = size_t{1} << 16;
  const auto blocks = static_cast<unsigned>(std::min((chunks + kWarpsPerBlock - 1) / kWarpsPerBlock, kMaxBlocks));
  DeviceGuard guard(stream.device());  // a kernel runs on the current device
  const auto native = cuda_stream(stream);
  visit_float_dtype(dtype, "chunk_sums_of_squares", "gradients", [&](auto type) {
    using T = typename decltype(type)::type;
    chunk_sums_kernel<T><<<blocks, kWarpsPerBlock * kNormWarp, 0, native>>>(static_cast<const T*>(grad), numel,
                                                               chunk_numel, chunks, scale, out);
    ZEST_CUDA_KERNEL_CHECK();
  });
}

}  // namespace zest::detail
