#include "zest/core/detail/cuda_runtime.h"

#include <cuda.h>  // the driver's types; its functions come from the runtime (driver_entry)
#include <cuda_runtime.h>

#include "zest/core/check.h"
#include "zest/core/cuda_check.h"
#include "zest/core/device.h"

namespace zest::cuda_rt {
namespace {

// A driver function, found through the runtime so that ZEST need not link
// libcuda itself.
template <typename Fn>
Fn driver_entry(const char* name) {
  void* fn = nullptr;
#if CUDART_VERSION >= 12000
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  ZEST_CUDA_CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status));
#else
  ZEST_CUDA_CHECK(cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &status));
#endif
  ZEST_CHECK(status == cudaDriverEntryPointSuccess && fn != nullptr,
             "the CUDA driver has no {} (query result {}); update the NVIDIA driver", name,
             static_cast<int>(status));
#else
  ZEST_CUDA_CHECK(cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault));
  ZEST_CHECK(fn != nullptr, "the CUDA driver has no {}; update the NVIDIA driver", name);
#endif
  return reinterpret_cast<Fn>(fn);
}

using CtxGetCurrent = CUresult (*)(CUcontext*);
using CtxSetCurrent = CUresult (*)(CUcontext);

void check_driver(CUresult r, const char* what) {
  ZEST_CHECK(r == CUDA_SUCCESS, "{} failed with CUDA driver error {}", what, static_cast<int>(r));
}

}  // namespace

int device_count() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();  // "no GPU here" is an answer, not an error
    return 0;
  }
  ZEST_CUDA_CHECK(err);
  return n;
}

int current_device() {
  int d = 0;
  ZEST_CUDA_CHECK(cudaGetDevice(&d));
  return d;
}

void set_device(int device) { ZEST_CUDA_CHECK(cudaSetDevice(device)); }

int current_device_or_none() {
  static const auto get = driver_entry<CtxGetCurrent>("cuCtxGetCurrent");
  CUcontext ctx = nullptr;
  const CUresult r = get(&ctx);
  if (r == CUDA_ERROR_NOT_INITIALIZED) return -1;  // no context anywhere yet
  check_driver(r, "cuCtxGetCurrent");
  return ctx == nullptr ? -1 : current_device();
}

void clear_current_device() {
  static const auto set = driver_entry<CtxSetCurrent>("cuCtxSetCurrent");
  check_driver(set(nullptr), "cuCtxSetCurrent(nullptr)");
}

void device_synchronize(int device) {
  DeviceGuard guard(Device::cuda(device));
  ZEST_CUDA_CHECK(cudaDeviceSynchronize());
}

MemInfo mem_info(int device) {
  DeviceGuard guard(Device::cuda(device));
  MemInfo info;
  ZEST_CUDA_CHECK(cudaMemGetInfo(&info.free_bytes, &info.total_bytes));
  return info;
}

void* stream_create(int device) {
  DeviceGuard guard(Device::cuda(device));
  cudaStream_t s = nullptr;
  // Non-blocking: ZEST's streams must not serialize with a user's work on the
  // legacy default stream; ordering is always explicit through events.
  ZEST_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_destroy(int device, void* stream) noexcept {
  const int previous = [] {
    int d = 0;
    return cudaGetDevice(&d) == cudaSuccess ? d : -1;
  }();
  if (previous != device) ZEST_CUDA_WARN(cudaSetDevice(device));
  ZEST_CUDA_WARN(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
  if (previous >= 0 && previous != device) ZEST_CUDA_WARN(cudaSetDevice(previous));
}

void stream_synchronize(void* stream) {
  ZEST_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

bool stream_query(void* stream) {
  const cudaError_t err = cudaStreamQuery(static_cast<cudaStream_t>(stream));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  ZEST_CUDA_CHECK(err);
  return true;
}

void stream_wait_event(void* stream, void* event) {
  ZEST_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                      static_cast<cudaEvent_t>(event), 0));
}

void* event_create(int device, bool timing) {
  DeviceGuard guard(Device::cuda(device));
  cudaEvent_t e = nullptr;
  ZEST_CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

void event_destroy(int device, void* event) noexcept {
  (void)device;  // events may be destroyed from any current device
  ZEST_CUDA_WARN(cudaEventDestroy(static_cast<cudaEvent_t>(event)));
}

void event_record(void* event, void* stream) {
  ZEST_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

bool event_query(void* event) {
  const cudaError_t err = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (err == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  ZEST_CUDA_CHECK(err);
  return true;
}

void event_synchronize(void* event) {
  ZEST_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

float event_elapsed_ms(void* start, void* end) {
  float ms = 0.0f;
  ZEST_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                                       static_cast<cudaEvent_t>(end)));
  return ms;
}

}  // namespace zest::cuda_rt
