#include "zest/torch/host_tensor_allocator.h"

#include <c10/core/CPUAllocator.h>

#include <cstring>
#include <mutex>

#include "zest/core/env_flag.h"

namespace zest {
namespace {

// Lives as long as the process: tensors from it may be freed during exit.
HugePageCache& cache() {
  static auto* c = new HugePageCache();
  return *c;
}

void give_back(void* block) { cache().deallocate(block); }

// libtorch's own allocator's raw deleter, for the smaller blocks.
c10::DeleterFnPtr smaller_raw_deleter = nullptr;

// Some kernels (GELU's, for one) take scratch memory through
// Allocator::raw_allocate and give it back through raw_deleter(), one
// function for every block: so it tells the cache's blocks from libtorch's.
void give_back_any(void* block) {
  if (!cache().deallocate_if_owned(block)) smaller_raw_deleter(block);
}

// libtorch 1.13 declares `DataPtr allocate(size_t) const` and no
// copy_data; 2.x declares `DataPtr allocate(size_t)` and a pure
// `copy_data(...) const`. Both allocate()s are defined (without
// `override`, which one of the two would fail), and copy_data too: each
// version overrides what it declares and sees the rest as plain overloads.
class HugePageHostAllocator final : public c10::Allocator {
 public:
  explicit HugePageHostAllocator(c10::Allocator* smaller) : smaller_(smaller) {}

  c10::DataPtr allocate(size_t bytes) const { return take(bytes); }
  c10::DataPtr allocate(size_t bytes) { return take(bytes); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    if (count > 0) std::memcpy(dest, src, count);
  }
  // Where libtorch's allocator has no raw interface, neither has this one.
  c10::DeleterFnPtr raw_deleter() const override {
    return smaller_raw_deleter != nullptr ? &give_back_any : nullptr;
  }

 private:
  c10::DataPtr take(size_t bytes) const {
    if (bytes < HugePageCache::kHugePage) return smaller_->allocate(bytes);
    void* block = cache().allocate(bytes);
    TORCH_CHECK(block != nullptr, "ZEST's huge page host tensor cache: not enough memory for a tensor of ", bytes,
                " bytes (", HugePageCache::block_size(bytes), " mapped in huge pages); in use ",
                cache().stats().in_use_bytes, " bytes");
    return {block, block, &give_back, c10::Device(c10::DeviceType::CPU)};
  }

  c10::Allocator* smaller_;
};

bool enabled_by_environment() {
  return env_flag("ZEST_HOST_TENSOR_CACHE",
                  "set 0 to keep libtorch's own host allocator, 1 or unset for huge pages")
      .value_or(true);
}

}  // namespace

bool use_huge_page_host_tensors() {
  static std::once_flag once;
  static bool installed = false;
  std::call_once(once, [] {
    if (!enabled_by_environment()) return;
    // c10::SetCPUAllocator keeps the pointer for good, as the cache is kept.
    c10::Allocator* smaller = c10::GetCPUAllocator();
    smaller_raw_deleter = smaller->raw_deleter();
    static auto* allocator = new HugePageHostAllocator(smaller);
    c10::SetCPUAllocator(allocator, /*priority=*/1);
    installed = c10::GetCPUAllocator() == allocator;
  });
  return installed;
}

HugePageCache::Stats host_tensor_memory() { return cache().stats(); }

void release_idle_host_tensors() { cache().release_idle(); }

}  // namespace zest
