// The caching allocator's blocks, the segments they tile, and the pools of
// free blocks searched for best fit: installed because CachingAllocator
// holds its pools by value, not an interface to call. See
// caching_allocator.cpp for the policies that use them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <set>
#include <vector>

#include "zest/core/stream.h"
#include "zest/core/units.h"
#include "zest/memory/memory_category.h"

namespace zest {

// Size classes. They match PyTorch's CUDA caching allocator, whose behaviour
// users already know and tune for.
inline constexpr size_t kMinBlockSize = 512;         // every size rounds up to a multiple of this
inline constexpr size_t kSmallSize = 1 * kMiB;       // requests up to this use the small pool
inline constexpr size_t kSmallBuffer = 2 * kMiB;     // segment size of the small pool
inline constexpr size_t kLargeBuffer = 20 * kMiB;    // segment size for 1-10 MiB requests
inline constexpr size_t kMinLargeAlloc = 10 * kMiB;  // from here a request gets its own segment
inline constexpr size_t kRoundLarge = 2 * kMiB;      // ...rounded up to a multiple of this

struct BlockPool;

// A contiguous range of a segment. The blocks of a segment form a doubly
// linked list in address order; a segment is "split" when it has more than one.
struct Block {
  Stream stream;                   // the stream it was allocated on; reused only there
  BlockPool* pool = nullptr;
  void* ptr = nullptr;
  size_t size = 0;                 // bytes, a multiple of kMinBlockSize
  size_t requested_size = 0;       // bytes asked for; 0 when free
  MemoryCategory category = MemoryCategory::kOther;
  bool allocated = false;
  int pending_events = 0;          // events to wait for before the block is free
  std::vector<Stream> stream_uses; // other streams that used it (record_stream)
  Block* prev = nullptr;
  Block* next = nullptr;

  Block(Stream s, BlockPool* p, void* address, size_t bytes)
      : stream(s), pool(p), ptr(address), size(bytes) {}
  bool is_split() const { return prev != nullptr || next != nullptr; }
};

// Best fit: ordered by stream, then size, then address, so lower_bound on
// (stream, size) finds the smallest block on that stream that is big enough,
// lowest address first among equals.
struct BlockOrder {
  bool operator()(const Block* a, const Block* b) const {
    if (a->stream.id() != b->stream.id()) return a->stream.id() < b->stream.id();
    if (a->size != b->size) return a->size < b->size;
    return reinterpret_cast<uintptr_t>(a->ptr) < reinterpret_cast<uintptr_t>(b->ptr);
  }
};

struct BlockPool {
  using Set = std::set<Block*, BlockOrder>;

  explicit BlockPool(bool small) : is_small(small) {}

  // Insertion and removal reuse the set's nodes, so that a cache hit does no
  // heap allocation of its own (the spare list only grows to the peak number
  // of free blocks).
  void insert(Block* block) {
    if (spare_nodes.empty()) {
      blocks.insert(block);
      return;
    }
    Set::node_type node = std::move(spare_nodes.back());
    spare_nodes.pop_back();
    node.value() = block;
    blocks.insert(std::move(node));
  }
  bool erase(Block* block) {
    Set::node_type node = blocks.extract(block);
    if (node.empty()) return false;
    spare_nodes.push_back(std::move(node));
    return true;
  }

  Set blocks;  // free blocks only
  std::vector<Set::node_type> spare_nodes;
  const bool is_small;
};

}  // namespace zest
