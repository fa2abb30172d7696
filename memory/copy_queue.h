// An ordered queue of copies that runs beside the calling thread, so that
// copies between device and host memory overlap the caller's own work (the
// host optimizer of an offloaded step, say).
//
//   // zest-example: run
//   const zest::Device device = zest::Device::host();  // or zest::Device::cuda(0)
//   std::vector<float> grads(1024, 1.0f), host_chunk(grads.size());
//   zest::CopyQueue d2h(device);
//   d2h.wait_for(zest::Stream::default_for(device));  // after the work queued there so far
//   d2h.copy(host_chunk.data(), grads.data(), grads.size() * sizeof(float));
//   const zest::CopyQueue::Mark m = d2h.mark();
//   // ...other work, while the copy runs...
//   d2h.synchronize(m);  // host_chunk holds the bytes
//
// On a CUDA device the queue is a stream of its own: copies are
// cudaMemcpyAsync on it (asynchronous for pinned host memory; see copy.h),
// marks are events. On the host, where a stream runs its work as it is
// issued (core/stream.h), the queue is a thread of its own that takes the
// copies in order, standing in for the GPU's copy engine. Either way every
// copy is copy_bytes() on the queue's stream, so the host backend runs the
// very copies, in the very order, that the CUDA backend queues.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "zest/core/stream.h"

namespace zest {

class CopyQueue {
 public:
  using Mark = uint64_t;

  // `timing`: busy time is measured (CUDA: an event pair around the copies
  // between two marks).
  explicit CopyQueue(Device device, bool timing = false);
  // Waits for the queued copies (errors are logged, not thrown).
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  Device device() const { return device_; }

  // Copies queued from now on start after the work queued on `stream` so far
  // (a stream of this device or the host's).
  void wait_for(const Stream& stream);
  // Queues copy_bytes(dst, src, bytes). The memory must stay valid, and src
  // unchanged, until a mark after the copy is synchronized.
  void copy(void* dst, const void* src, size_t bytes);
  // The point in the queue after the copies queued so far.
  Mark mark();
  // The host waits until every copy before `mark` is done. Rethrows the
  // first error of a copy on the host's thread (the queue then copies no
  // more).
  void synchronize(Mark mark);
  void synchronize() { synchronize(mark()); }
  // `stream`'s work queued from now on starts after the copies queued so
  // far (on the host: the calling thread waits for them).
  void join(const Stream& stream);
  // Milliseconds spent copying since the last call (0 without timing).
  // Synchronizes the queue.
  double take_busy_ms();

 private:
  struct Task {
    void* dst;
    const void* src;
    size_t bytes;
  };
  void worker();

  Device device_;
  bool timing_;
  // CUDA
  std::optional<OwnedStream> stream_;
  std::optional<Event> after_;  // wait_for's marker on the other stream
  std::deque<std::pair<Mark, Event>> marks_;
  std::vector<std::pair<Event, Event>> timed_;  // start and end of each batch
  bool open_ = false;                           // timed_.back() awaits its end
  Mark next_mark_ = 0;
  // Host: the copying thread and what it has to do.
  std::mutex mutex_;
  std::condition_variable work_;
  std::condition_variable progress_;
  std::deque<Task> tasks_;
  uint64_t queued_ = 0;  // tasks ever queued
  uint64_t done_ = 0;    // tasks finished (or skipped after an error)
  bool stop_ = false;
  std::exception_ptr error_;
  double busy_ms_ = 0.0;
  std::thread thread_;
};

}  // namespace zest
