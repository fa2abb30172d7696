// The CUDA runtime shim for builds without CUDA: there are no devices, and any
// attempt to use one says how to get a build that has them.
#include "zest/core/check.h"
#include "zest/core/detail/cuda_runtime.h"

namespace zest::cuda_rt {
namespace {
[[noreturn]] void no_cuda() {
  ZEST_FAIL("this build of ZEST has no CUDA backend; reconfigure with -DZEST_CUDA=ON on a "
            "machine with the CUDA toolkit, or use the host device");
}
}  // namespace

int device_count() { return 0; }
int current_device() { no_cuda(); }
int current_device_or_none() { no_cuda(); }
void clear_current_device() { no_cuda(); }
void set_device(int) { no_cuda(); }
void device_synchronize(int) { no_cuda(); }
MemInfo mem_info(int) { no_cuda(); }
void* stream_create(int) { no_cuda(); }
void stream_destroy(int, void*) noexcept {}
void stream_synchronize(void*) { no_cuda(); }
bool stream_query(void*) { no_cuda(); }
void stream_wait_event(void*, void*) { no_cuda(); }
void* event_create(int, bool) { no_cuda(); }
void event_destroy(int, void*) noexcept {}
void event_record(void*, void*) { no_cuda(); }
bool event_query(void*) { no_cuda(); }
void event_synchronize(void*) { no_cuda(); }
float event_elapsed_ms(void*, void*) { no_cuda(); }

}  // namespace zest::cuda_rt
