// Byte copies and zero fills, on the host (queued on a host stream's own
// thread, if it has one) or queued on a CUDA stream. The CUDA
// half is compiled only with the CUDA backend; without it a CUDA stream cannot
// be created (Stream::default_for and OwnedStream check the device first), so
// the branch that would need it reports the build instead.
#include "zest/memory/copy.h"

#include <cstdint>
#include <cstring>

#include "zest/core/check.h"
#include "zest/core/host_queue.h"
#include "zest/core/platform.h"

#if ZEST_WITH_CUDA
#include "zest/core/cuda_check.h"
#include "zest/core/cuda_stream.h"
#endif

namespace zest {
namespace {

// Overlap is undefined for memcpy and cudaMemcpy alike. With CUDA's unified
// addressing host and device pointers share one address space, so comparing
// addresses is meaningful whichever memory they name.
bool overlaps(const void* a, const void* b, size_t bytes) {
  const auto x = reinterpret_cast<uintptr_t>(a);
  const auto y = reinterpret_cast<uintptr_t>(b);
  return x < y ? y - x < bytes : x - y < bytes;
}

#if !ZEST_WITH_CUDA
[[noreturn]] void no_cuda(const char* what, const Stream& stream) {
  ZEST_FAIL("{} on {}: this build of ZEST has no CUDA backend; reconfigure with -DZEST_CUDA=ON",
            what, stream.device().str());
}
#endif

}  // namespace

void copy_bytes(const Stream& stream, void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  ZEST_CHECK(dst != nullptr && src != nullptr,
             "copy_bytes: {} pointer is null for a copy of {} bytes on {}",
             dst == nullptr ? "the destination" : "the source", bytes, stream.device().str());
  if (dst == src) return;  // the bytes are already there
  ZEST_CHECK(!overlaps(dst, src, bytes),
             "copy_bytes: source {} and destination {} overlap in a copy of {} bytes; copy "
             "through a separate buffer", src, dst, bytes);
  if (stream.device().is_host()) {
    host_launch(stream, [=] { std::memcpy(dst, src, bytes); });
    return;
  }
#if ZEST_WITH_CUDA
  // Copies are queued on the current device's context: make it the stream's.
  DeviceGuard guard(stream.device());
  ZEST_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda_stream(stream)));
#else
  no_cuda("copy_bytes", stream);
#endif
}

void fill_zero(const Stream& stream, void* dst, size_t bytes) {
  if (bytes == 0) return;
  ZEST_CHECK(dst != nullptr, "fill_zero: the destination pointer is null for {} bytes on {}", bytes,
             stream.device().str());
  if (stream.device().is_host()) {
    host_launch(stream, [=] { std::memset(dst, 0, bytes); });
    return;
  }
#if ZEST_WITH_CUDA
  DeviceGuard guard(stream.device());
  ZEST_CUDA_CHECK(cudaMemsetAsync(dst, 0, bytes, cuda_stream(stream)));
#else
  no_cuda("fill_zero", stream);
#endif
}

}  // namespace zest
