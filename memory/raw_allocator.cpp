#include "zest/memory/raw_allocator.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdlib>

#include "zest/core/check.h"
#include "zest/core/units.h"

namespace zest {
namespace {

// Page alignment keeps every block offset (a multiple of 512) as aligned on the
// host as it is in cudaMalloc'ed memory, so vector loads behave the same.
constexpr size_t kHostAlignment = 4096;
constexpr size_t kHugePage = size_t{2} << 20;

class HostRawAllocator final : public RawAllocator {
 public:
  Device device() const override { return Device::host(); }
  std::string_view name() const override { return "host"; }

  void* allocate(size_t size_bytes) override {
    if (size_bytes > SIZE_MAX - kHugePage) return nullptr;
    if (size_bytes < kHugePage) return std::aligned_alloc(kHostAlignment, round_up(size_bytes, kHostAlignment));
    // Note [host memory in huge pages]: segments of 2 MiB and more (the
    // caching allocator's large pool rounds to 2 MiB already) are asked for
    // in transparent huge pages. Shards, gathers and buckets are streamed
    // through at memory bandwidth, and 4 KiB pages cost a TLB miss every
    // 4 KiB: under nested paging (a VM) a miss walks two page tables, and a
    // pread into such memory ran 5-10x slower than into huge pages
    // (bench/hf_load_bench, docs/BENCHMARKS.md). Advice only: where THP is
    // off, the memory is as good in 4 KiB pages.
    void* p = std::aligned_alloc(kHugePage, round_up(size_bytes, kHugePage));
    if (p != nullptr) (void)::madvise(p, round_up(size_bytes, kHugePage), MADV_HUGEPAGE);
    return p;
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
