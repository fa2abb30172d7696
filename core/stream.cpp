#include "zest/core/stream.h"

#include <atomic>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/detail/cuda_runtime.h"
#include "zest/core/host_queue.h"

namespace zest {
namespace {

// Ids count up from 1 for the process's lifetime and are never reused, on
// the host and on CUDA alike. A CUDA stream's id is not its handle: the
// driver hands a destroyed stream's address to the next one created, and
// the caching allocator, which keys blocks by stream id, would take the new
// stream for the old (reusing a block the old one's work may still read).
uint64_t next_stream_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

Stream Stream::default_for(Device device) {
  check_device_available(device);
  return Stream(device, 0, nullptr);
}

// Every use of a CUDA stream handle runs with the stream's device current:
// handle 0, default_for()'s, is the legacy stream of whichever device is
// current, and an event must be recorded on a stream of its own device.
void Stream::synchronize() const {
  if (HostQueue* q = queue_for(*this)) return q->wait(q->last_ticket());
  if (device_.is_host()) return;
  DeviceGuard guard(device_);
  cuda_rt::stream_synchronize(native_);
}

bool Stream::query() const {
  if (HostQueue* q = queue_for(*this)) return q->done(q->last_ticket());
  if (device_.is_host()) return true;
  DeviceGuard guard(device_);
  return cuda_rt::stream_query(native_);
}

void Stream::wait(const Event& event) const {
  ZEST_CHECK(event.device() == device_, "a stream on {} cannot wait for an event on {}",
             device_.str(), event.device().str());
  if (device_.is_host()) {
    const std::shared_ptr<HostQueue>& from = event.host_queue_;
    if (!from || from.get() == host_queue()) return;  // complete, or earlier in this queue
    if (HostQueue* q = queue_for(*this)) {
      // A failure of the event's stream fails this one too: its later work
      // would read what the failed work did not write.
      q->submit([from, ticket = event.host_ticket_] { from->wait(ticket); });
    } else {
      from->wait(event.host_ticket_);
    }
    return;
  }
  DeviceGuard guard(device_);
  cuda_rt::stream_wait_event(native_, event.native());
}

OwnedStream::OwnedStream(Device device, HostWork host_work)
    : stream_(Stream::default_for(device)), owned_(true) {
  if (device.is_cuda()) {
    void* s = cuda_rt::stream_create(device.index());
    stream_ = Stream(device, next_stream_id(), s);
  } else {
    if (host_work == HostWork::kOwnThread) queue_ = HostQueue::start();
    stream_ = Stream(device, next_stream_id(), queue_.get());
  }
}

OwnedStream::~OwnedStream() { reset(); }

OwnedStream::OwnedStream(OwnedStream&& other) noexcept
    : stream_(other.stream_), owned_(std::exchange(other.owned_, false)), queue_(std::move(other.queue_)) {}

OwnedStream& OwnedStream::operator=(OwnedStream&& other) noexcept {
  if (this != &other) {
    reset();
    stream_ = other.stream_;
    owned_ = std::exchange(other.owned_, false);
    queue_ = std::move(other.queue_);
  }
  return *this;
}

void OwnedStream::reset() noexcept {
  if (owned_ && stream_.device().is_cuda()) {
    cuda_rt::stream_destroy(stream_.device().index(), stream_.native());
  }
  // Events recorded on it may keep the queue; its thread ends here.
  if (queue_) queue_->stop();
  queue_.reset();
  owned_ = false;
}

Event::Event(Device device, bool timing) : device_(device), timing_(timing) {
  check_device_available(device);
  if (device.is_cuda()) native_ = cuda_rt::event_create(device.index(), timing);
}

Event::~Event() { reset(); }

Event::Event(Event&& other) noexcept
    : device_(other.device_),
      native_(std::exchange(other.native_, nullptr)),
      timing_(other.timing_),
      recorded_(other.recorded_),
      host_queue_(std::move(other.host_queue_)),
      host_ticket_(other.host_ticket_),
      host_time_(std::move(other.host_time_)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    reset();
    device_ = other.device_;
    native_ = std::exchange(other.native_, nullptr);
    timing_ = other.timing_;
    recorded_ = other.recorded_;
    host_queue_ = std::move(other.host_queue_);
    host_ticket_ = other.host_ticket_;
    host_time_ = std::move(other.host_time_);
  }
  return *this;
}

void Event::reset() noexcept {
  if (native_ != nullptr) cuda_rt::event_destroy(device_.index(), native_);
  native_ = nullptr;
}

void Event::record(const Stream& stream) {
  ZEST_CHECK(stream.device() == device_, "an event of {} cannot be recorded on a stream of {}",
             device_.str(), stream.device().str());
  if (device_.is_cuda()) {
    DeviceGuard guard(device_);  // the stream may be handle 0 (Stream::synchronize says why)
    cuda_rt::event_record(native_, stream.native());
  } else if (HostQueue* q = queue_for(stream)) {
    host_queue_ = q->shared_from_this();
    if (timing_) {
      // Stamped by the stream's thread when it gets here; a fresh stamp per
      // record, so an earlier record's pending task writes an old one.
      host_time_ = std::make_shared<std::chrono::steady_clock::time_point>();
      host_ticket_ = q->submit([t = host_time_] { *t = std::chrono::steady_clock::now(); });
    } else {
      host_ticket_ = q->last_ticket();
    }
  } else {
    host_queue_.reset();
    host_ticket_ = 0;
    if (timing_) {
      host_time_ = std::make_shared<std::chrono::steady_clock::time_point>(std::chrono::steady_clock::now());
    }
  }
  recorded_ = true;
}

bool Event::query() const {
  if (device_.is_host()) return !host_queue_ || host_queue_->done(host_ticket_);
  return cuda_rt::event_query(native_);
}

void Event::synchronize() const {
  if (host_queue_) host_queue_->wait(host_ticket_);
  if (device_.is_cuda()) cuda_rt::event_synchronize(native_);
}

void Event::synchronize_quietly() const {
  if (host_queue_) return host_queue_->wait_quietly(host_ticket_);
  synchronize();
}

float Event::elapsed_ms(const Event& end) const {
  ZEST_CHECK(timing_ && end.timing_, "elapsed_ms needs two events created with timing=true");
  ZEST_CHECK(recorded_ && end.recorded_, "elapsed_ms needs both events recorded first");
  ZEST_CHECK(device_ == end.device_, "elapsed_ms between events of {} and {}", device_.str(),
             end.device_.str());
  if (device_.is_cuda()) return cuda_rt::event_elapsed_ms(native_, end.native_);
  ZEST_CHECK(query() && end.query(),
             "elapsed_ms of events on a host stream not yet done: synchronize the later one first");
  return std::chrono::duration<float, std::milli>(*end.host_time_ - *host_time_).count();
}

}  // namespace zest
