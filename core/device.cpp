#include "zest/core/device.h"

#include <charconv>

#include "zest/core/check.h"
#include "zest/core/detail/cuda_runtime.h"
#include "zest/core/device_switch.h"
#include "zest/core/logging.h"

namespace zest {

std::string Device::str() const {
  return is_host() ? std::string("host") : fmt::format("cuda:{}", index_);
}

Device parse_device(std::string_view text) {
  if (text == "host" || text == "cpu") return Device::host();
  int index = -1;
  if (text == "cuda") {
    index = 0;
  } else if (text.starts_with("cuda:")) {
    const std::string_view digits = text.substr(5);
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec != std::errc() || end != digits.data() + digits.size() || index < 0) index = -1;
  }
  ZEST_CHECK(index >= 0, "unknown device '{}'; expected host, cpu, cuda or cuda:N", text);
  const Device d = Device::cuda(index);
  check_device_available(d);
  return d;
}

int cuda_device_count() {
  static const int count = cuda_rt::device_count();
  return count;
}

void check_device_available(Device device) {
  if (device.is_host()) return;
  ZEST_CHECK(ZEST_WITH_CUDA, "device {} requested but this build of ZEST has no CUDA backend; "
                             "reconfigure with -DZEST_CUDA=ON", device.str());
  const int n = cuda_device_count();
  ZEST_CHECK(device.index() >= 0 && device.index() < n,
             "device {} requested but {} CUDA device(s) are visible{}", device.str(), n,
             n == 0 ? " (is CUDA_VISIBLE_DEVICES set, or the driver missing?)" : "");
}

void set_current_device(Device device) {
  if (!device.is_cuda()) return;
  check_device_available(device);
  // Asked of the thread's context, not cudaGetDevice: that answers 0 on a
  // thread with no context current, and skipping the set there would leave
  // the thread with none, which a DeviceGuard then restores.
  if (cuda_rt::current_device_or_none() != device.index()) cuda_rt::set_device(device.index());
}

namespace {

// The calling thread's device, through the CUDA runtime shim.
struct ThreadDevice {
  int current() const { return cuda_rt::current_device_or_none(); }
  void set(int device) const { cuda_rt::set_device(device); }
  void clear() const { cuda_rt::clear_current_device(); }
};

}  // namespace

DeviceGuard::DeviceGuard(Device device) {
  if (!device.is_cuda()) return;
  ThreadDevice ops;
  previous_ = detail::switch_device(ops, device.index());
}

DeviceGuard::~DeviceGuard() {
  if (previous_ == detail::kKeepDevice) return;
  try {
    ThreadDevice ops;
    detail::leave_device(ops, previous_);
  } catch (const Error& e) {
    ZEST_LOG_WARN("could not restore the current CUDA device: {}", e.what());
  }
}

}  // namespace zest
