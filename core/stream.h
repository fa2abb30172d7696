// Streams and events: ordered queues of device work and markers in them.
//
// On a CUDA device these are real CUDA streams and events. On the host, work
// on a stream runs synchronously when it is issued, so a host stream is
// trivially ordered: an event is complete as soon as it is recorded and
// waiting is a no-op. Host streams still have distinct identities, because
// the caching allocator keeps blocks per stream whatever the device.
//
// A host stream created with HostWork::kOwnThread is asynchronous, as a CUDA
// stream is: its work runs on a thread of its own (host_queue.h), in the
// order issued, while the issuing thread goes on; events mark points in it,
// and a stream or the host waits for them. The work that honours such a
// stream: copy_bytes and fill_zero (memory/copy.h), the gradient operations
// of optim/grad_ops.h and optim/grad_norm.h, and Communicator's collectives
// (which then run in the order they were issued across all of a
// communicator's streams). Any other host function given one runs in the
// caller's thread, unordered with it: synchronize the stream first. The
// engine's communication stream is one (overlap_comm on the host); its
// compute stream may not be.
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
#include <memory>

#include "zest/core/device.h"

namespace zest {

class Event;
class HostQueue;

// Where a host stream's work runs: in the thread that issues it, or on a
// thread of the stream's own. CUDA streams ignore it.
enum class HostWork { kInline, kOwnThread };

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
  // cudaStream_t for CUDA streams, the HostQueue of a host stream with its
  // own thread, nullptr for other host streams.
  void* native() const { return native_; }
  // The thread a host stream's work runs on; nullptr where it runs inline
  // (and for CUDA streams).
  HostQueue* host_queue() const {
    return device_.is_host() ? static_cast<HostQueue*>(native_) : nullptr;
  }

  // Host waits for all work queued so far; rethrows a host stream's
  // failure (host_queue.h, Note [a failed host stream]).
  void synchronize() const;
  bool query() const;          // true when all work queued so far is done
  // Later work waits for the event. An inline host stream's later work is
  // the caller's, so the caller waits here (and gets the event's stream's
  // failure, if any).
  void wait(const Event& event) const;

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
  explicit OwnedStream(Device device, HostWork host_work = HostWork::kInline);
  // Runs what is queued on a host stream's thread, then ends it.
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
  std::shared_ptr<HostQueue> queue_;  // HostWork::kOwnThread
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
  // Host waits for it; rethrows the failure of the host stream it was
  // recorded on, if any.
  void synchronize() const;
  // Waits as synchronize() does, without rethrowing: for what only needs the
  // point reached (the caching allocator's deferred frees).
  void synchronize_quietly() const;
  // Milliseconds from this event to `end`; both recorded, both with timing.
  float elapsed_ms(const Event& end) const;

 private:
  friend class Stream;  // a host stream's wait reads where the event is
  void reset() noexcept;
  Device device_;
  void* native_ = nullptr;
  bool timing_ = false;
  bool recorded_ = false;
  // On a host stream with its own thread: the stream's queue and the ticket
  // of the last task before the event, and (timing) the time that task
  // ended, written by the stream's thread.
  std::shared_ptr<HostQueue> host_queue_;
  uint64_t host_ticket_ = 0;
  std::shared_ptr<std::chrono::steady_clock::time_point> host_time_;
};

}  // namespace zest
