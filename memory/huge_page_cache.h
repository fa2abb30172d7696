// Blocks of host memory in whole 2 MiB huge pages, kept for reuse when
// freed: where libtorch's large host tensors come from once
// zest::use_huge_page_host_tensors() (torch/host_tensor_allocator.h) is
// called. Note [huge pages for libtorch's host tensors] in the .cpp says why.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "zest/memory/raw_allocator.h"

namespace zest {

class HugePageCache {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  struct Stats {
    size_t in_use_bytes = 0;  // handed out and not yet given back
    size_t idle_bytes = 0;    // given back, kept for reuse
    size_t peak_in_use_bytes = 0;
    int64_t hits = 0;         // allocations served from idle blocks
    int64_t misses = 0;       // allocations that mapped new memory
    int64_t evictions = 0;    // idle blocks given back to stay under the peak
  };

  HugePageCache();
  HugePageCache(const HugePageCache&) = delete;
  HugePageCache& operator=(const HugePageCache&) = delete;
  // Gives the idle blocks back to the system; blocks still in use must have
  // been given back to the cache.
  ~HugePageCache();

  // A block of at least `bytes` (rounded up to whole huge pages), aligned to
  // kHugePage; nullptr when the system has no memory for it (the idle blocks
  // are given back and the allocation tried again first). Thread-safe.
  void* allocate(size_t bytes);
  // Gives back a block from allocate(). Thread-safe.
  void deallocate(void* block) noexcept;
  // deallocate() of `block` if it came from allocate() (true); otherwise
  // nothing (false), for a caller that frees other memory through one path.
  bool deallocate_if_owned(void* block) noexcept;

  // Gives every idle block back to the system.
  void release_idle() noexcept;
  Stats stats() const;
  // The bytes allocate(bytes) takes: whole huge pages.
  static size_t block_size(size_t bytes);

 private:
  struct Idle {
    void* block;
    size_t bytes;
  };
  bool give_back(void* block) noexcept;
  void evict_locked(size_t needed) noexcept;
  void give_back_idle_locked(std::list<Idle>::iterator it) noexcept;

  std::unique_ptr<RawAllocator> raw_;  // huge pages for blocks of 2 MiB and more
  mutable std::mutex mu_;
  std::unordered_map<void*, size_t> in_use_;  // block -> bytes
  std::list<Idle> idle_;                      // front: the most recently freed
  std::unordered_multimap<size_t, std::list<Idle>::iterator> idle_by_size_;
  Stats stats_;
};

}  // namespace zest
