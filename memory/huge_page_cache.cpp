// Note [huge pages for libtorch's host tensors]. libtorch takes its host
// tensors from malloc, in 4 KiB pages. Under nested paging (a VM) a TLB
// miss walks the guest's page table and the host's, and the memory-bound
// kernels of a CPU training step (OpenBLAS packing its operands with a
// stride of a row, copies, GELU, softmax) miss on nearly every row: on the
// 2-core VM of docs/BENCHMARKS.md those kernels ran 2-5x slower in one
// process than in another, by whichever physical memory each process got,
// and the whole forward and backward up to 1.5x; a 25M-parameter GPT step
// over 2 MPI processes took 2.6-3.2 s in malloc's pages against 2.26-2.29 s
// with glibc advising huge pages for them. malloc also gives back to the
// system what a step frees (a thread's arena unmaps its emptied heaps; large
// blocks are mmapped and unmapped), so the next step faults the same memory
// in again: about 5,000 page faults a step.
//
// So blocks of 2 MiB and more come from the host's raw allocator, which
// asks for them in whole huge pages (Note [host memory in huge pages] in
// raw_allocator.cpp), and are kept when freed: a training step allocates
// the same sizes as the step before, and finds them here. The cache never
// grows the process past its own high-water mark: a block is taken anew only
// when what is in use and idle, plus it, stays within the most ever in use,
// or after the idle blocks least recently freed are given back to make it so.
#include "zest/memory/huge_page_cache.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

#include "zest/core/logging.h"

namespace zest {

HugePageCache::HugePageCache() : raw_(make_host_allocator()) {}

HugePageCache::~HugePageCache() { release_idle(); }

size_t HugePageCache::block_size(size_t bytes) {
  if (bytes == 0) return kHugePage;
  if (bytes > SIZE_MAX - kHugePage) return 0;
  return (bytes + kHugePage - 1) / kHugePage * kHugePage;
}

void* HugePageCache::allocate(size_t bytes) {
  const size_t size = block_size(bytes);
  if (size == 0) return nullptr;
  const std::lock_guard<std::mutex> lock(mu_);
  void* block = nullptr;
  if (const auto it = idle_by_size_.find(size); it != idle_by_size_.end()) {
    block = it->second->block;
    idle_.erase(it->second);
    idle_by_size_.erase(it);
    stats_.idle_bytes -= size;
    ++stats_.hits;
  } else {
    const size_t peak = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes + size);
    const size_t total = stats_.in_use_bytes + stats_.idle_bytes + size;
    if (total > peak) evict_locked(total - peak);
    block = raw_->allocate(size);
    if (block == nullptr && !idle_.empty()) {
      while (!idle_.empty()) give_back_idle_locked(std::prev(idle_.end()));
      block = raw_->allocate(size);
    }
    if (block == nullptr) return nullptr;
    ++stats_.misses;
  }
  in_use_.emplace(block, size);
  stats_.in_use_bytes += size;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  return block;
}

void HugePageCache::deallocate(void* block) noexcept {
  if (block != nullptr && !give_back(block)) {
    ZEST_LOG_ERROR("a host tensor block at {} was given back to the huge page cache, which did not hand it out",
                   block);
  }
}

bool HugePageCache::deallocate_if_owned(void* block) noexcept { return block != nullptr && give_back(block); }

bool HugePageCache::give_back(void* block) noexcept {
  const std::lock_guard<std::mutex> lock(mu_);
  const auto it = in_use_.find(block);
  if (it == in_use_.end()) return false;
  const size_t size = it->second;
  in_use_.erase(it);
  stats_.in_use_bytes -= size;
  idle_.push_front(Idle{block, size});
  idle_by_size_.emplace(size, idle_.begin());
  stats_.idle_bytes += size;
  return true;
}

void HugePageCache::evict_locked(size_t needed) noexcept {
  size_t freed = 0;
  while (freed < needed && !idle_.empty()) {
    const auto last = std::prev(idle_.end());
    freed += last->bytes;
    give_back_idle_locked(last);
    ++stats_.evictions;
  }
}

void HugePageCache::give_back_idle_locked(std::list<Idle>::iterator it) noexcept {
  const auto [first, last] = idle_by_size_.equal_range(it->bytes);
  for (auto i = first; i != last; ++i) {
    if (i->second == it) {
      idle_by_size_.erase(i);
      break;
    }
  }
  raw_->deallocate(it->block, it->bytes);
  stats_.idle_bytes -= it->bytes;
  idle_.erase(it);
}

void HugePageCache::release_idle() noexcept {
  const std::lock_guard<std::mutex> lock(mu_);
  while (!idle_.empty()) give_back_idle_locked(std::prev(idle_.end()));
}

HugePageCache::Stats HugePageCache::stats() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace zest
