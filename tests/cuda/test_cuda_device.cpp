// DeviceGuard on a real GPU: a thread that never had a current device is
// left with none (Note [no current device] in core/device_switch.h).
#include <doctest/doctest.h>

#include <thread>

#include "zest/core/detail/cuda_runtime.h"
#include "zest/core/device.h"

using namespace zest;

TEST_CASE("a DeviceGuard on a thread with no current device leaves it with none") {
  int before = 0, inside = 0, after = 0;
  std::thread t([&] {
    before = cuda_rt::current_device_or_none();
    {
      DeviceGuard guard(Device::cuda(0));
      inside = cuda_rt::current_device_or_none();
    }
    after = cuda_rt::current_device_or_none();
  });
  t.join();
  CHECK(before == -1);
  CHECK(inside == 0);
  CHECK(after == -1);  // before the fix: 0, GPU 0's context made current
}

TEST_CASE("a DeviceGuard restores the device a thread had") {
  std::thread t([] {
    set_current_device(Device::cuda(0));
    {
      DeviceGuard guard(Device::cuda(0));
      CHECK(cuda_rt::current_device_or_none() == 0);
    }
    CHECK(cuda_rt::current_device_or_none() == 0);
  });
  t.join();
}
