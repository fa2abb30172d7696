// Internal: the handful of CUDA runtime calls that core/ needs, behind plain
// types so that device.h and stream.h stay free of CUDA headers. Implemented in
// cuda_runtime.cpp when built with CUDA, and by cuda_runtime_stub.cpp (which
// reports that CUDA is not built in) otherwise.
#pragma once

#include <cstddef>

namespace zest::cuda_rt {

int device_count();  // 0 on no driver / no device
int current_device();
// The current device, or -1 when the calling thread has no current CUDA
// context (Note [no current device] in device_switch.h).
int current_device_or_none();
// Leaves the calling thread with no current CUDA context.
void clear_current_device();
void set_device(int device);
void device_synchronize(int device);

struct MemInfo {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
MemInfo mem_info(int device);

// Streams and events are passed as void* (cudaStream_t / cudaEvent_t).
void* stream_create(int device);  // non-blocking w.r.t. the legacy stream
void stream_destroy(int device, void* stream) noexcept;
void stream_synchronize(void* stream);
bool stream_query(void* stream);
void stream_wait_event(void* stream, void* event);

void* event_create(int device, bool timing);
void event_destroy(int device, void* event) noexcept;
void event_record(void* event, void* stream);
bool event_query(void* event);
void event_synchronize(void* event);
float event_elapsed_ms(void* start, void* end);

}  // namespace zest::cuda_rt
