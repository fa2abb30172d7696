// What an engine's memory holds, by the categories of memory_category.h
// (the ZeRO paper's terms): on its device, in host memory (offload) and on
// NVMe, and the process's resident memory beside it. Engine::memory_report().
#pragma once

#include <array>
#include <cstdint>

#include "zest/memory/memory_category.h"

namespace zest {

// Bytes by category, now and at their peak, from the allocator's tags.
struct MemoryReport {
  struct Entry {
    int64_t current = 0;
    int64_t peak = 0;
  };
  std::array<Entry, kNumMemoryCategories> by_category{};
  // Of kParameters' current bytes, those of frozen units (they have nothing
  // in the other categories).
  int64_t frozen_parameters = 0;
  int64_t reserved = 0;   // segments the allocator holds
  int64_t allocated = 0;  // blocks in use (rounded sizes)
  // The highest reserved and allocated since the allocator's construction
  // (or its reset_peak_stats()): what the engine's allocator took from the
  // system at most, the part of a process's peak memory that is ZEST's.
  int64_t peak_reserved = 0;
  int64_t peak_allocated = 0;

  const Entry& operator[](MemoryCategory c) const { return by_category[category_index(c)]; }
  // current bytes of parameters, gradients, master weights and optimizer state
  int64_t model_states() const;

  // The same from the host allocator (offload_optimizer, offload_param):
  // the offloaded master weights and optimizer state, the offloaded
  // parameter shards, and the copies' staging (comm_buffers). All zero
  // without offload.
  std::array<Entry, kNumMemoryCategories> host_by_category{};
  int64_t host_reserved = 0;
  int64_t host_allocated = 0;
  int64_t host_peak_reserved = 0;
  const Entry& host(MemoryCategory c) const { return host_by_category[category_index(c)]; }
  int64_t host_model_states() const;

  // The NVMe tier (offload_optimizer device nvme): the bytes of this rank's
  // swap file by category, kMasterWeights its master fields and
  // kOptimizerState the rest (state buffers and the records' alignment),
  // both regions (engine/detail/offload_swap.h), and with offload_param nvme
  // kParameters the parameter swap file (engine/detail/param_swap.h); the files'
  // sizes are fixed, so current and peak are equal. All zero without them.
  // host_swap_buffers: of the host allocator's comm_buffers, the swap
  // ring's block (Note [swap ring in the host allocator] in
  // engine/detail/offload_swap.h) and the parameter swap pool's.
  std::array<Entry, kNumMemoryCategories> nvme_by_category{};
  int64_t host_swap_buffers = 0;
  const Entry& nvme(MemoryCategory c) const { return nvme_by_category[category_index(c)]; }
  int64_t nvme_bytes() const;

  // Note [what a process's peak RSS holds]. The process's resident memory
  // when the report was taken (core/process_memory.h; -1 where unknown),
  // and of its peak the part that is this engine's: what its allocators
  // took from host memory at most (the host allocator's peak reserved, and
  // the device allocator's when the device is the host). The rest, which
  // no allocator of ZEST's holds, is libtorch's (activations, its own
  // caching allocator), the runtime's (code, libraries, thread stacks) and
  // the program's; unaccounted_peak() names it for a process of one rank.
  int64_t process_rss = -1;
  int64_t process_peak_rss = -1;
  int64_t engine_host_peak = 0;
  // process_peak_rss - engine_host_peak; -1 where the peak is unknown. With
  // several in-process ranks subtract every rank's engine_host_peak.
  int64_t unaccounted_peak() const { return process_peak_rss < 0 ? -1 : process_peak_rss - engine_host_peak; }
};

}  // namespace zest
