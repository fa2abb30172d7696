// Checks for NCCL calls. Include only from code compiled with NCCL.
//
//   // zest-example: needs=cuda prelude=cuda
//   ncclComm_t comm = nullptr;
//   ZEST_NCCL_CHECK(ncclAllReduce(src, dst, n, ncclFloat, ncclSum, comm, stream));
//
// The message names the expression, NCCL's error string and its last-error
// detail (ncclGetLastError), the current device and, through zest::Error,
// rank and file:line. ncclInProgress is not an error here: callers that use
// non-blocking communicators poll for it themselves.
#pragma once

#include <nccl.h>

#include "zest/core/check.h"

namespace zest::detail {
[[noreturn]] void throw_nccl_error(ncclResult_t result, const char* expr, const char* file,
                                   int line);
void warn_nccl_error(ncclResult_t result, const char* expr, const char* file, int line);
}  // namespace zest::detail

#define ZEST_NCCL_CHECK(expr)                                                     \
  do {                                                                            \
    const ncclResult_t zest_nccl_res_ = (expr);                                   \
    if (ZEST_UNLIKELY(zest_nccl_res_ != ncclSuccess && zest_nccl_res_ != ncclInProgress)) { \
      ::zest::detail::throw_nccl_error(zest_nccl_res_, #expr, __FILE__, __LINE__); \
    }                                                                             \
  } while (0)

#define ZEST_NCCL_WARN(expr)                                                      \
  do {                                                                            \
    const ncclResult_t zest_nccl_res_ = (expr);                                   \
    if (ZEST_UNLIKELY(zest_nccl_res_ != ncclSuccess && zest_nccl_res_ != ncclInProgress)) { \
      ::zest::detail::warn_nccl_error(zest_nccl_res_, #expr, __FILE__, __LINE__);  \
    }                                                                             \
  } while (0)
