// Formatting of CUDA, NCCL and MPI failures, compiled for the libraries this
// build has. One file so all three read alike.
#include <string>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/logging.h"

#if ZEST_WITH_CUDA
#include "zest/core/cuda_check.h"
#endif
#if ZEST_WITH_NCCL
#include "zest/core/nccl_check.h"
#endif
#if ZEST_WITH_MPI
#include "zest/core/mpi_check.h"
#endif

namespace zest::detail {
namespace {

#if ZEST_WITH_CUDA
// The current device, without raising a second error while reporting one.
std::string current_device_text() {
  int device = -1;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "cuda:?";
  }
  return fmt::format("cuda:{}", device);
}

std::string cuda_text(cudaError_t err, const char* expr) {
  return fmt::format("CUDA error {} ({}: {}) from `{}` on device {}", static_cast<int>(err),
                     cudaGetErrorName(err), cudaGetErrorString(err), expr, current_device_text());
}
#endif

#if ZEST_WITH_NCCL
std::string nccl_text(ncclResult_t result, const char* expr) {
  const char* last = ncclGetLastError(nullptr);
  return fmt::format("NCCL error {} ({}) from `{}` on device {}{}{}", static_cast<int>(result),
                     ncclGetErrorString(result), expr, current_device_text(),
                     (last != nullptr && *last != '\0') ? "; NCCL says: " : "",
                     last != nullptr ? last : "");
}
#endif

#if ZEST_WITH_MPI
std::string mpi_text(int code, const char* expr) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, buf, &len) != MPI_SUCCESS) {
    len = 0;
  }
  return fmt::format("MPI error {} ({}) from `{}`", code, std::string_view(buf, len), expr);
}
#endif

}  // namespace

#if ZEST_WITH_CUDA
// Both clear CUDA's last-error state once the error is reported, so a failure
// that was caught and handled is not reported again by the next
// ZEST_CUDA_KERNEL_CHECK as a failed launch. (Sticky errors, which leave the
// context unusable, stay; every later call reports them.)
void throw_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  std::string text = cuda_text(err, expr);
  (void)cudaGetLastError();
  throw_error(file, line, std::move(text));
}
void warn_cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  ZEST_LOG_WARN("{} ({}:{})", cuda_text(err, expr), file, line);
  (void)cudaGetLastError();
}
#endif

#if ZEST_WITH_NCCL
void throw_nccl_error(ncclResult_t result, const char* expr, const char* file, int line) {
  throw_error(file, line, nccl_text(result, expr));
}
void warn_nccl_error(ncclResult_t result, const char* expr, const char* file, int line) {
  ZEST_LOG_WARN("{} ({}:{})", nccl_text(result, expr), file, line);
}
#endif

#if ZEST_WITH_MPI
void throw_mpi_error(int code, const char* expr, const char* file, int line) {
  throw_error(file, line, mpi_text(code, expr));
}
void warn_mpi_error(int code, const char* expr, const char* file, int line) {
  ZEST_LOG_WARN("{} ({}:{})", mpi_text(code, expr), file, line);
}
#endif

}  // namespace zest::detail
