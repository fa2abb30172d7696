// DeviceGuard's logic (core/device_switch.h) over a fake thread state: it
// restores the previous device, changes nothing when the device is current
// already, and leaves a thread that had no device with none rather than
// making GPU 0 current (Note [no current device]).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "zest/core/device_switch.h"

using namespace zest::detail;

namespace {

struct FakeThread {
  int device = kNoDevice;
  std::vector<std::string> calls;
  int current() const { return device; }
  void set(int d) {
    calls.push_back("set " + std::to_string(d));
    device = d;
  }
  void clear() {
    calls.push_back("clear");
    device = kNoDevice;
  }
};

}  // namespace

TEST_CASE("a device switch on a thread with no device leaves it with none, not GPU 0") {
  FakeThread thread;
  const int previous = switch_device(thread, 1);
  CHECK(thread.device == 1);
  leave_device(thread, previous);
  CHECK(thread.device == kNoDevice);
  CHECK(thread.calls == std::vector<std::string>{"set 1", "clear"});
  // Nested: the inner switch restores the outer device, the outer one none.
  thread.calls.clear();
  const int outer = switch_device(thread, 0);
  const int inner = switch_device(thread, 2);
  leave_device(thread, inner);
  CHECK(thread.device == 0);
  leave_device(thread, outer);
  CHECK(thread.device == kNoDevice);
  CHECK(thread.calls == std::vector<std::string>{"set 0", "set 2", "set 0", "clear"});
}

TEST_CASE("a device switch restores the previous device, and changes nothing when current") {
  FakeThread thread;
  thread.device = 3;
  const int same = switch_device(thread, 3);
  CHECK(same == kKeepDevice);
  leave_device(thread, same);
  CHECK(thread.calls.empty());
  const int previous = switch_device(thread, 0);
  CHECK(previous == 3);
  leave_device(thread, previous);
  CHECK(thread.device == 3);
  CHECK(thread.calls == std::vector<std::string>{"set 0", "set 3"});
}
