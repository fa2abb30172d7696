// Where memory lives and work runs: the host, or one CUDA device.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace zest {

enum class DeviceType : uint8_t { kHost, kCuda };

class Device {
 public:
  constexpr Device() = default;  // the host
  static constexpr Device host() { return Device(); }
  static constexpr Device cuda(int index) { return Device(DeviceType::kCuda, index); }

  constexpr DeviceType type() const { return type_; }
  constexpr int index() const { return index_; }
  constexpr bool is_host() const { return type_ == DeviceType::kHost; }
  constexpr bool is_cuda() const { return type_ == DeviceType::kCuda; }

  // "host" or "cuda:N"
  std::string str() const;

  friend constexpr bool operator==(Device a, Device b) {
    return a.type_ == b.type_ && a.index_ == b.index_;
  }

 private:
  constexpr Device(DeviceType type, int index) : type_(type), index_(index) {}
  DeviceType type_ = DeviceType::kHost;
  int index_ = -1;
};

// Parses "host" / "cpu" / "cuda" (device 0) / "cuda:N"; throws zest::Error
// for anything else, or for a CUDA device this build or machine does not have.
Device parse_device(std::string_view text);

// Number of CUDA devices visible; 0 when built without CUDA or when the
// machine has no GPU or driver (never an error).
int cuda_device_count();

// Throws zest::Error unless `device` can be used here: built with CUDA, and
// the index names a visible GPU.
void check_device_available(Device device);

// Makes `device` the calling thread's current CUDA device for good, as
// torch.cuda.set_device does; a no-op for the host. A process that drives one
// GPU calls it once, before any other CUDA work: the DeviceGuards inside ZEST
// then find their device current and change nothing (otherwise each guard
// switches the device on entry and back on exit, two driver calls).
// make_nccl_communicator calls it.
void set_current_device(Device device);

// Makes `device` current for the calling thread (CUDA) for a scope and
// restores the previous one; a thread that had no current device is left
// with none (Note [no current device] in device_switch.h), not with GPU 0.
// A no-op for the host.
class DeviceGuard {
 public:
  explicit DeviceGuard(Device device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -2;  // detail::kKeepDevice
};

}  // namespace zest
