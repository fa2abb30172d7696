// Checks for CUDA runtime calls and kernel launches. Include only from code
// compiled with the CUDA toolkit (ZEST_WITH_CUDA).
//
//   // zest-example: needs=cuda prelude=cuda
//   ZEST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));  // throws zest::Error
//   fill<<<grid, block, 0, stream>>>(dst_floats, n);
//   ZEST_CUDA_KERNEL_CHECK();                // catches launch-configuration errors
//   ZEST_CUDA_WARN(cudaFree(p));             // for destructors: logs, never throws
//
// The message names the expression, the CUDA error's name and text, the current
// device and (through zest::Error) rank and file:line.
#pragma once

#include <cuda_runtime.h>

#include "zest/core/check.h"

namespace zest::detail {
[[noreturn]] void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
void warn_cuda_error(cudaError_t err, const char* expr, const char* file, int line);
}  // namespace zest::detail

#define ZEST_CUDA_CHECK(expr)                                                   \
  do {                                                                          \
    const cudaError_t zest_cuda_err_ = (expr);                                  \
    if (ZEST_UNLIKELY(zest_cuda_err_ != cudaSuccess)) {                         \
      ::zest::detail::throw_cuda_error(zest_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

#define ZEST_CUDA_WARN(expr)                                                    \
  do {                                                                          \
    const cudaError_t zest_cuda_err_ = (expr);                                  \
    if (ZEST_UNLIKELY(zest_cuda_err_ != cudaSuccess)) {                         \
      ::zest::detail::warn_cuda_error(zest_cuda_err_, #expr, __FILE__, __LINE__); \
    }                                                                           \
  } while (0)

// cudaGetLastError, not cudaPeekAtLastError: a launch error is not sticky, so
// it is consumed here and the next check does not report it a second time.
#define ZEST_CUDA_KERNEL_CHECK()                                                \
  do {                                                                          \
    const cudaError_t zest_cuda_err_ = cudaGetLastError();                      \
    if (ZEST_UNLIKELY(zest_cuda_err_ != cudaSuccess)) {                         \
      ::zest::detail::throw_cuda_error(zest_cuda_err_, "kernel launch", __FILE__, __LINE__); \
    }                                                                           \
  } while (0)
