// Statistics and snapshots of the caching allocator: plain data, read by tests,
// tools and the memory accounting of the engine.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "zest/memory/memory_category.h"

namespace zest {

// One quantity over the allocator's lifetime.
struct Stat {
  int64_t current = 0;    // now
  int64_t peak = 0;       // highest `current` since construction or reset_peak_stats()
  int64_t allocated = 0;  // sum of all increases
  int64_t freed = 0;      // sum of all decreases

  void increase(int64_t amount) {
    current += amount;
    allocated += amount;
    if (current > peak) peak = current;
  }
  void decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
  void reset_peak() { peak = current; }
};

// Each stat is kept for both pools together and for each pool.
enum class StatPool : uint8_t { kAggregate = 0, kSmall = 1, kLarge = 2 };
using StatArray = std::array<Stat, 3>;
inline const Stat& at(const StatArray& a, StatPool p) { return a[static_cast<size_t>(p)]; }

struct AllocatorStats {
  StatArray allocation;            // COUNT: live allocations handed to callers
  StatArray segment;               // COUNT: segments obtained from the raw allocator
  StatArray active;                // COUNT: blocks allocated, or freed but awaiting stream events
  StatArray inactive_split;        // COUNT: free blocks inside segments that are split
  StatArray allocated_bytes;       // SUM bytes: sizes (rounded) of live allocations
  StatArray reserved_bytes;        // SUM bytes: segments held from the raw allocator
  StatArray active_bytes;          // SUM bytes: sizes of active blocks
  StatArray inactive_split_bytes;  // SUM bytes: free bytes inside split segments
  StatArray requested_bytes;       // SUM bytes: sizes callers asked for, before rounding

  // Per category: bytes callers asked for, and the rounded block sizes.
  std::array<Stat, kNumMemoryCategories> category_requested_bytes;
  std::array<Stat, kNumMemoryCategories> category_allocated_bytes;

  int64_t num_alloc_retries = 0;      // allocations that had to free cached segments and retry
  int64_t num_ooms = 0;               // allocations that failed after all retries
  int64_t num_raw_allocs = 0;         // calls into the raw allocator that succeeded
  int64_t num_raw_frees = 0;          // segments returned to the raw allocator
  int64_t num_sync_all_streams = 0;   // times all pending stream events were waited for
  int64_t num_deferred_frees = 0;     // frees delayed by record_stream until events completed

  const Stat& category_requested(MemoryCategory c) const {
    return category_requested_bytes[category_index(c)];
  }
  const Stat& category_allocated(MemoryCategory c) const {
    return category_allocated_bytes[category_index(c)];
  }
};

enum class BlockState : uint8_t {
  kAllocated,        // handed to a caller
  kPendingFree,      // freed by the caller, waiting for events on other streams
  kFree,             // in the pool, reusable
};

struct BlockInfo {
  size_t size = 0;            // bytes, a multiple of 512
  size_t requested_size = 0;  // bytes asked for (0 for free blocks)
  BlockState state = BlockState::kFree;
  MemoryCategory category = MemoryCategory::kOther;  // meaningful unless free
};

struct SegmentInfo {
  uintptr_t address = 0;
  size_t total_size = 0;      // bytes obtained from the raw allocator
  size_t allocated_size = 0;  // bytes in allocated blocks
  size_t active_size = 0;     // bytes in allocated or pending-free blocks
  uint64_t stream_id = 0;     // stream the segment's blocks belong to
  bool is_small_pool = false;
  std::vector<BlockInfo> blocks;  // in address order, covering the segment
};

}  // namespace zest
