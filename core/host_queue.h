// The thread behind an asynchronous host stream (OwnedStream with
// HostWork::kOwnThread): tasks run one at a time, in the order submitted,
// each numbered by a ticket, so that a host stream can overlap the thread
// that queues work on it as a CUDA stream overlaps the host.
//
// Note [a failed host stream]. A task that throws ends the queue's useful
// life, as a CUDA error is sticky: the first exception is kept, the tasks
// after it are skipped (counted as done, so nothing waits for them forever),
// and every later wait that reports errors rethrows it. Skipping matters: a
// task after a failed reduction would read what that reduction did not
// write.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>

#include "zest/core/stream.h"

namespace zest {

class HostQueue : public std::enable_shared_from_this<HostQueue> {
 public:
  // Starts the thread, which works for the caller's rank (rank_context.h).
  static std::shared_ptr<HostQueue> start();
  ~HostQueue();  // stop()s first
  HostQueue(const HostQueue&) = delete;
  HostQueue& operator=(const HostQueue&) = delete;

  // Queues `task`; its ticket is the number of tasks submitted so far.
  uint64_t submit(std::function<void()> task);
  // The ticket of the last task submitted (0 before any).
  uint64_t last_ticket() const;
  // True once the task numbered `ticket` and all before it ran or were skipped.
  bool done(uint64_t ticket) const;
  // Blocks until done(ticket). wait() then rethrows the queue's failure, if
  // any (Note [a failed host stream]); wait_quietly() does not.
  void wait(uint64_t ticket) const;
  void wait_quietly(uint64_t ticket) const;
  // Rethrows the queue's failure, if any.
  void rethrow_failure() const;
  // True when called from the queue's own thread, where waiting for a later
  // task of the queue could never end.
  bool on_own_thread() const { return std::this_thread::get_id() == thread_.get_id(); }
  // Runs what is queued, then ends the thread. Later submits are refused.
  void stop() noexcept;

 private:
  HostQueue() = default;
  void work();

  mutable std::mutex mutex_;
  mutable std::condition_variable queued_;     // the thread waits for tasks
  mutable std::condition_variable completed_;  // waiters wait for tickets
  std::deque<std::function<void()>> tasks_;
  uint64_t submitted_ = 0;
  uint64_t finished_ = 0;
  std::exception_ptr failure_;
  bool stopping_ = false;
  std::thread thread_;
};

// The queue a host stream's work issued by the calling thread goes to:
// nullptr where that work runs now, in the caller's thread, which is also
// the case on the stream's own thread (a task's work on its own stream, as a
// backend's copies inside a collective, is part of the task).
inline HostQueue* queue_for(const Stream& stream) {
  HostQueue* queue = stream.host_queue();
  return queue != nullptr && !queue->on_own_thread() ? queue : nullptr;
}

// Runs a host stream's work where the stream runs it: queued on the stream's
// own thread, or now, in the caller's. `fn` is kept until it runs, so it
// captures by value.
template <typename Fn>
void host_launch(const Stream& stream, Fn&& fn) {
  if (HostQueue* queue = queue_for(stream)) {
    queue->submit(std::forward<Fn>(fn));
  } else {
    fn();
  }
}

}  // namespace zest
