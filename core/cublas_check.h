// Checks for cuBLAS calls, in the family of cuda_check.h and nccl_check.h.
// Include only from code compiled with the CUDA toolkit that links cuBLAS
// (CUDA::cublas): libzest itself does not use cuBLAS, so, unlike the CUDA and
// NCCL checks (core/library_errors.cpp), the reporting is inline here and
// compiled into the code that calls cuBLAS.
//
//   // zest-example: needs=cuda prelude=cuda
//   cublasHandle_t handle = nullptr;
//   ZEST_CUBLAS_CHECK(cublasCreate(&handle));       // throws zest::Error on failure
//   ZEST_CUBLAS_CHECK(cublasSetStream(handle, stream));
//   ZEST_CUBLAS_WARN(cublasDestroy(handle));        // for destructors: logs, never throws
//
// The message names the expression, cuBLAS's status name and text, the current
// device and (through zest::Error) rank and file:line.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string>

#include "zest/core/check.h"
#include "zest/core/logging.h"

namespace zest::detail {

inline std::string cublas_text(cublasStatus_t status, const char* expr) {
  int device = -1;
  std::string where = "cuda:?";
  if (cudaGetDevice(&device) == cudaSuccess) {
    where = fmt::format("cuda:{}", device);
  } else {
    (void)cudaGetLastError();  // not reported a second time by the next check
  }
  return fmt::format("cuBLAS error {} ({}: {}) from `{}` on device {}", static_cast<int>(status),
                     cublasGetStatusName(status), cublasGetStatusString(status), expr, where);
}

[[noreturn]] inline void throw_cublas_error(cublasStatus_t status, const char* expr, const char* file,
                                            int line) {
  throw_error(file, line, cublas_text(status, expr));
}

inline void warn_cublas_error(cublasStatus_t status, const char* expr, const char* file, int line) {
  ZEST_LOG_WARN("{} ({}:{})", cublas_text(status, expr), file, line);
}

}  // namespace zest::detail

#define ZEST_CUBLAS_CHECK(expr)                                                   \
  do {                                                                            \
    const cublasStatus_t zest_cublas_status_ = (expr);                            \
    if (ZEST_UNLIKELY(zest_cublas_status_ != CUBLAS_STATUS_SUCCESS)) {            \
      ::zest::detail::throw_cublas_error(zest_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

#define ZEST_CUBLAS_WARN(expr)                                                    \
  do {                                                                            \
    const cublasStatus_t zest_cublas_status_ = (expr);                            \
    if (ZEST_UNLIKELY(zest_cublas_status_ != CUBLAS_STATUS_SUCCESS)) {            \
      ::zest::detail::warn_cublas_error(zest_cublas_status_, #expr, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)
