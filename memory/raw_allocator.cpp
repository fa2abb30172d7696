#include "zest/memory/raw_allocator.h"

#include <unistd.h>

#include <cstdlib>

#include "zest/core/check.h"
#include "zest/core/units.h"

namespace zest {
namespace {

// Page alignment keeps every block offset (a multiple of 512) as aligned on the
// host as it is in cudaMalloc'ed memory, so vector loads behave the same.
constexpr size_t kHostAlignment = 4096;

class HostRawAllocator final : public RawAllocator {
 public:
  Device device() const override { return Device::host(); }
  std::string_view name() const override { return "host"; }

  void* allocate(size_t size_bytes) override {
    if (size_bytes > SIZE_MAX - kHostAlignment) return nullptr;
    return std::aligned_alloc(kHostAlignment, round_up(size_bytes, kHostAlignment));
  }
  void deallocate(void* ptr, size_t) noexcept override { std::free(ptr); }

  RawMemoryInfo memory_info() const override {
    const long page = sysconf(_SC_PAGESIZE);
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long avail = sysconf(_SC_AVPHYS_PAGES);
    RawMemoryInfo info;
    if (page > 0 && pages > 0) info.total_bytes = static_cast<size_t>(page) * static_cast<size_t>(pages);
    if (page > 0 && avail > 0) info.free_bytes = static_cast<size_t>(page) * static_cast<size_t>(avail);
    return info;
  }
};

class LimitedRawAllocator final : public RawAllocator {
 public:
  LimitedRawAllocator(std::unique_ptr<RawAllocator> inner, size_t capacity)
      : inner_(std::move(inner)), capacity_(capacity) {
    ZEST_CHECK(inner_ != nullptr, "make_limited_allocator needs an allocator to wrap");
  }
  Device device() const override { return inner_->device(); }
  std::string_view name() const override { return "limited"; }

  void* allocate(size_t size_bytes) override {
    if (size_bytes > capacity_ - used_) return nullptr;
    void* p = inner_->allocate(size_bytes);
    if (p != nullptr) used_ += size_bytes;
    return p;
  }
  void deallocate(void* ptr, size_t size_bytes) noexcept override {
    inner_->deallocate(ptr, size_bytes);
    used_ -= size_bytes;
  }
  RawMemoryInfo memory_info() const override { return {capacity_ - used_, capacity_}; }

 private:
  // The caching allocator calls raw allocators under its own lock, so no lock here.
  std::unique_ptr<RawAllocator> inner_;
  size_t capacity_;
  size_t used_ = 0;
};

}  // namespace

std::unique_ptr<RawAllocator> make_host_allocator() { return std::make_unique<HostRawAllocator>(); }

std::unique_ptr<RawAllocator> make_limited_allocator(std::unique_ptr<RawAllocator> inner,
                                                     size_t capacity_bytes) {
  return std::make_unique<LimitedRawAllocator>(std::move(inner), capacity_bytes);
}

}  // namespace zest
