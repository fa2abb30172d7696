#include "zest/core/host_queue.h"

#include <utility>

#include "zest/core/check.h"
#include "zest/core/rank_context.h"

namespace zest {

std::shared_ptr<HostQueue> HostQueue::start() {
  std::shared_ptr<HostQueue> queue(new HostQueue);
  const RankContext rank = this_rank();
  // The thread takes `this`, not a shared_ptr: stop() joins it before the
  // queue can be destroyed, and a shared_ptr would keep it alive forever.
  queue->thread_ = std::thread([q = queue.get(), rank] {
    if (rank.rank >= 0) set_thread_rank(rank.rank, rank.world_size);
    q->work();
  });
  return queue;
}

HostQueue::~HostQueue() { stop(); }

uint64_t HostQueue::submit(std::function<void()> task) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ZEST_CHECK(!stopping_, "work queued on a host stream that is being destroyed");
    tasks_.push_back(std::move(task));
    ticket = ++submitted_;
  }
  queued_.notify_one();
  return ticket;
}

uint64_t HostQueue::last_ticket() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_;
}

bool HostQueue::done(uint64_t ticket) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return finished_ >= ticket;
}

void HostQueue::wait_quietly(uint64_t ticket) const {
  std::unique_lock<std::mutex> lock(mutex_);
  if (finished_ >= ticket) return;
  ZEST_INTERNAL_ASSERT(!on_own_thread(), "a host stream's task waits for a later task of its own stream");
  completed_.wait(lock, [&] { return finished_ >= ticket; });
}

void HostQueue::wait(uint64_t ticket) const {
  wait_quietly(ticket);
  rethrow_failure();
}

void HostQueue::rethrow_failure() const {
  std::exception_ptr failure;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    failure = failure_;
  }
  if (failure) std::rethrow_exception(failure);
}

void HostQueue::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  if (thread_.joinable() && !on_own_thread()) thread_.join();
}

void HostQueue::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    queued_.wait(lock, [&] { return !tasks_.empty() || stopping_; });
    if (tasks_.empty()) return;  // stopping, and everything queued has run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    const bool skip = failure_ != nullptr;  // Note [a failed host stream]
    lock.unlock();
    std::exception_ptr failure;
    if (!skip) {
      try {
        task();
      } catch (...) {
        failure = std::current_exception();
      }
    }
    task = nullptr;  // what it captured goes before its ticket is done
    lock.lock();
    if (failure && !failure_) failure_ = failure;
    ++finished_;
    completed_.notify_all();
  }
}

}  // namespace zest
