// Helpers for the caching allocator tests: a capacity-limited host allocator
// and stream events that complete only when the test says so, so that every
// policy can be checked exactly on a machine without a GPU.
#pragma once

#include <cstdint>
#include <map>
#include <memory>

#include "zest/core/stream.h"
#include "zest/core/units.h"
#include "zest/memory/caching_allocator.h"

namespace zest::test {

class ManualStreamEvents final : public StreamEvents {
 public:
  Token record(const Stream& stream) override {
    const Token t = next_++;
    events_[t] = {stream.id(), false};
    ++recorded;
    return t;
  }
  bool completed(Token t) override { return events_.at(t).done; }
  void synchronize(Token t) override {
    events_.at(t).done = true;  // the host "waited" for it
    ++synchronized;
  }
  void release(Token t) override {
    events_.erase(t);
    ++released;
  }

  // Completes every event recorded so far on `stream`.
  void complete(const Stream& stream) {
    for (auto& [t, e] : events_) {
      if (e.stream_id == stream.id()) e.done = true;
    }
  }
  size_t outstanding() const { return events_.size(); }

  int recorded = 0;
  int synchronized = 0;
  int released = 0;

 private:
  struct State {
    uint64_t stream_id;
    bool done;
  };
  Token next_ = 1;
  std::map<Token, State> events_;
};

struct TestAllocator {
  explicit TestAllocator(size_t capacity = 64 * kMiB, AllocatorConfig config = {}) {
    auto events_owned = std::make_unique<ManualStreamEvents>();
    events = events_owned.get();
    alloc = std::make_unique<CachingAllocator>(
        make_limited_allocator(make_host_allocator(), capacity), config, std::move(events_owned));
  }
  CachingAllocator& operator*() { return *alloc; }
  CachingAllocator* operator->() { return alloc.get(); }

  std::unique_ptr<CachingAllocator> alloc;
  ManualStreamEvents* events = nullptr;
  Stream stream = Stream::default_for(Device::host());
};

inline int64_t current(const StatArray& a, StatPool p = StatPool::kAggregate) { return at(a, p).current; }
inline int64_t peak(const StatArray& a, StatPool p = StatPool::kAggregate) { return at(a, p).peak; }

inline ptrdiff_t offset(const void* base, const void* p) {
  return static_cast<const char*>(p) - static_cast<const char*>(base);
}

inline constexpr int64_t MiB(double x) { return static_cast<int64_t>(x * 1024 * 1024); }
inline constexpr int64_t KiB(double x) { return static_cast<int64_t>(x * 1024); }

}  // namespace zest::test
