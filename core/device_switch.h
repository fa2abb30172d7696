// What DeviceGuard does, written over the three calls it needs, so that the
// host tests run it with fake ones (tests/core/test_device_switch.cpp).
//
// Note [no current device]. A thread that never made a device current has
// no CUDA context current, yet cudaGetDevice answers 0 for it. A guard that
// then restored "device 0" with cudaSetDevice(0) would make GPU 0's primary
// context current, and since CUDA 12 that creates it: hundreds of MiB on a
// GPU the thread never used, on every rank of a node. So the guard asks
// whether the thread has a current context at all, and restores "none"
// (the driver's cuCtxSetCurrent(nullptr)) to a thread that had none.
#pragma once

namespace zest::detail {

// switch_device's answer: what leave_device restores.
inline constexpr int kKeepDevice = -2;  // the device was current already: nothing
inline constexpr int kNoDevice = -1;    // the thread had no current device: none again

// `ops` has: int current() (the current device, or kNoDevice when the thread
// has no current context); void set(int device); void clear() (no current
// context). Makes `device` current; returns what to restore.
template <typename Ops>
int switch_device(Ops& ops, int device) {
  const int current = ops.current();
  if (current == device) return kKeepDevice;
  ops.set(device);
  return current;
}

template <typename Ops>
void leave_device(Ops& ops, int previous) {
  if (previous == kKeepDevice) return;
  if (previous == kNoDevice) {
    ops.clear();
  } else {
    ops.set(previous);
  }
}

}  // namespace zest::detail
