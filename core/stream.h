// Streams and events: ordered queues of device work and markers in them.
//
// On a CUDA device these are real CUDA streams and events. On the host, work
// runs synchronously when it is issued, so a host stream is trivially ordered:
// an event is complete as soon as it is recorded and waiting is a no-op. Host
// streams still have distinct identities, because the caching allocator keeps
// blocks per stream whatever the device.
//
//   // zest-example: run
//   Device device = Device::host();             // or Device::cuda(0)
//   Stream compute_stream = Stream::default_for(device);
//   OwnedStream comm(device);                 // a new stream, destroyed with it
//   Event grads_ready(device);
//   grads_ready.record(compute_stream);       // after the backward kernels
//   comm.get().wait(grads_ready);             // comm work queued after it
#pragma once

#include <chrono>
#include <cstdint>

#include "zest/core/device.h"

namespace zest {

class Event;

// A non-owning handle: cheap to copy, compared by identity.
class Stream {
 public:
  // The device's default stream: CUDA's legacy stream, or the host's stream 0.
  static Stream default_for(Device device);

  Device device() const { return device_; }
  // 0 for the default stream; otherwise given at creation and never given
  // again in this process, even to a stream created at a destroyed one's
  // address (so a stream's identity outlives it).
  uint64_t id() const { return id_; }
  // cudaStream_t for CUDA streams, nullptr for the host.
  void* native() const { return native_; }

  void synchronize() const;    // host waits for all work queued so far
  bool query() const;          // true when all work queued so far is done
  void wait(const Event& event) const;  // later work waits for the event

  friend bool operator==(const Stream& a, const Stream& b) {
    return a.device_ == b.device_ && a.id_ == b.id_;
  }

 private:
  friend class OwnedStream;
  Stream(Device device, uint64_t id, void* native) : device_(device), id_(id), native_(native) {}
  Device device_;
  uint64_t id_ = 0;
  void* native_ = nullptr;
};

// Creates a stream and destroys it at scope end.
class OwnedStream {
 public:
  explicit OwnedStream(Device device);
  ~OwnedStream();
  OwnedStream(OwnedStream&& other) noexcept;
  OwnedStream& operator=(OwnedStream&& other) noexcept;
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;

  Stream get() const { return stream_; }
  operator Stream() const { return stream_; }  // NOLINT: a stream is what it is for

 private:
  void reset() noexcept;
  Stream stream_;
  bool owned_ = false;
};

class Event {
 public:
  // `timing` enables elapsed_ms (costs a little on CUDA, so off by default).
  explicit Event(Device device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  Device device() const { return device_; }
  void* native() const { return native_; }

  void record(const Stream& stream);
  bool query() const;       // true once the work before record() is done
  void synchronize() const; // host waits for it
  // Milliseconds from this event to `end`; both recorded, both with timing.
  float elapsed_ms(const Event& end) const;

 private:
  void reset() noexcept;
  Device device_;
  void* native_ = nullptr;
  bool timing_ = false;
  bool recorded_ = false;
  std::chrono::steady_clock::time_point host_time_{};
};

}  // namespace zest
