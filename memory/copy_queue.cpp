#include "zest/memory/copy_queue.h"

#include <chrono>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/memory/copy.h"

namespace zest {

CopyQueue::CopyQueue(Device device, bool timing) : device_(device), timing_(timing) {
  if (device.is_cuda()) {
    stream_.emplace(device);
    after_.emplace(device);
  } else {
    thread_ = std::thread([this] { worker(); });
  }
}

CopyQueue::~CopyQueue() {
  if (stream_) {
    try {
      stream_->get().synchronize();
    } catch (const std::exception&) {
      ZEST_LOG_WARN("copy queue teardown: {}", current_exception_text());
    }
    return;
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  work_.notify_one();
  thread_.join();  // the worker finishes the queued copies first
}

void CopyQueue::worker() {
  const Stream host = Stream::default_for(Device::host());
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    work_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;  // stop_, and nothing left
    const Task t = tasks_.front();
    tasks_.pop_front();
    const bool skip = error_ != nullptr;
    lock.unlock();
    std::exception_ptr error;
    double ms = 0.0;
    if (!skip) {
      const auto start = std::chrono::steady_clock::now();
      try {
        copy_bytes(host, t.dst, t.src, t.bytes);
      } catch (...) {
        error = std::current_exception();
      }
      ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    }
    lock.lock();
    if (error && !error_) error_ = error;
    busy_ms_ += ms;
    ++done_;
    progress_.notify_all();
  }
}

void CopyQueue::wait_for(const Stream& stream) {
  // A host stream's work is done when it is issued: nothing to wait for.
  if (!stream_ || stream.device().is_host()) return;
  ZEST_CHECK(stream.device() == device_, "CopyQueue of {}: cannot wait for a stream of {}", device_.str(),
             stream.device().str());
  after_->record(stream);
  stream_->get().wait(*after_);
}

void CopyQueue::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  if (stream_) {
    // Timed from the first copy after a mark to the next mark: one event
    // pair per batch of copies, recorded after any wait_for, so the time
    // is the copying's.
    if (timing_ && !open_) {
      timed_.emplace_back(Event(device_, true), Event(device_, true));
      timed_.back().first.record(*stream_);
      open_ = true;
    }
    copy_bytes(*stream_, dst, src, bytes);
    return;
  }
  // The checks copy_bytes makes, here on the caller's thread, so a bad copy
  // fails where it was asked for.
  ZEST_CHECK(dst != nullptr && src != nullptr, "CopyQueue::copy: {} pointer is null for a copy of {} bytes",
             dst == nullptr ? "the destination" : "the source", bytes);
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back({dst, src, bytes});
    ++queued_;
  }
  work_.notify_one();
}

CopyQueue::Mark CopyQueue::mark() {
  if (!stream_) {
    const std::lock_guard<std::mutex> lock(mutex_);
    return queued_;
  }
  if (open_) {
    timed_.back().second.record(*stream_);
    open_ = false;
  }
  Event e(device_);
  e.record(*stream_);
  marks_.emplace_back(++next_mark_, std::move(e));
  return next_mark_;
}

void CopyQueue::synchronize(Mark m) {
  if (stream_) {
    // The stream runs in order: once m's event is done, so are the earlier ones.
    while (!marks_.empty() && marks_.front().first <= m) {
      if (marks_.front().first == m) marks_.front().second.synchronize();
      marks_.pop_front();
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  progress_.wait(lock, [&] { return done_ >= m; });
  if (error_) std::rethrow_exception(error_);
}

void CopyQueue::join(const Stream& stream) {
  if (!stream_ || stream.device().is_host()) {
    synchronize();
    return;
  }
  ZEST_CHECK(stream.device() == device_, "CopyQueue of {}: cannot order a stream of {} after it", device_.str(),
             stream.device().str());
  Event e(device_);
  e.record(*stream_);
  stream.wait(e);  // the wait holds on to the event's state; it may be destroyed now
}

double CopyQueue::take_busy_ms() {
  if (!stream_) {
    synchronize();
    const std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(busy_ms_, 0.0);
  }
  if (open_) mark();
  stream_->get().synchronize();
  double ms = 0.0;
  for (const auto& [start, end] : timed_) ms += start.elapsed_ms(end);
  timed_.clear();
  return ms;
}

}  // namespace zest
