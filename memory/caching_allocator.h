// A caching allocator for one device, in the design of PyTorch's CUDA caching
// allocator, over any raw allocator (host, CUDA device, pinned host, or a
// capacity-limited one for tests). Freed memory stays cached and is handed out
// again without calling the raw allocator: cudaMalloc costs tens of
// microseconds and cudaFree synchronizes the device; a cache hit costs a
// lookup in a sorted set.
//
//   // zest-example: run
//   size_t n = 1024;
//   Stream stream = Stream::default_for(Device::host());
//   OwnedStream comm_stream(Device::host());
//   CachingAllocator alloc(make_host_allocator());
//   Buffer grads = alloc.allocate_buffer(n * sizeof(float), stream, MemoryCategory::kGradients);
//   float* g = grads.as<float>();                    // used on `stream`
//   g[0] = 1.0f;
//   alloc.record_stream(grads.data(), comm_stream);  // also used on another stream
//   grads.reset();  // reused only after comm_stream's work queued so far is done
//
// Every allocation is tagged with a MemoryCategory, so stats() reports memory
// by what it is for. Thread-safe: one lock guards all state.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/lifetime.h"
#include "zest/core/stream.h"
#include "zest/memory/allocator_config.h"
#include "zest/memory/allocator_stats.h"
#include "zest/memory/block_pool.h"
#include "zest/memory/memory_category.h"
#include "zest/memory/raw_allocator.h"
#include "zest/memory/stream_events.h"

namespace zest {

// Thrown when memory cannot be had even after freeing the cache. Its message
// gives the numbers needed to tell a too-large model from fragmentation.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(std::string message, const char* file, int line, size_t requested_bytes)
      : Error(std::move(message), file, line), requested_bytes_(requested_bytes) {}
  size_t requested_bytes() const { return requested_bytes_; }

 private:
  size_t requested_bytes_;
};

class Buffer;

class CachingAllocator {
 public:
  // Requests above this are refused as malformed (a negative size cast to
  // size_t, say) before any allocation is attempted.
  static constexpr size_t kMaxRequestBytes = size_t{1} << 56;

  explicit CachingAllocator(std::unique_ptr<RawAllocator> raw,
                            AllocatorConfig config = AllocatorConfig::from_env(),
                            std::unique_ptr<StreamEvents> events = nullptr);
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  Device device() const { return device_; }
  const AllocatorConfig& config() const { return config_; }

  // Returns memory for `size_bytes` (> 0) to be used on `stream`. Throws
  // OutOfMemoryError when it cannot be had, zest::Error for a bad request.
  void* allocate(size_t size_bytes, const Stream& stream,
                 MemoryCategory category = MemoryCategory::kOther);
  // Takes back memory from allocate(). If record_stream() named other
  // streams, the block is reused only after their work queued so far is done.
  void free(void* ptr);
  // Declares that `stream`, other than the allocation stream, uses the block.
  void record_stream(void* ptr, const Stream& stream);

  Buffer allocate_buffer(size_t size_bytes, const Stream& stream,
                         MemoryCategory category = MemoryCategory::kOther);

  // Returns every cached segment with no block in use to the raw allocator,
  // after waiting for pending stream events.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peak_stats();
  std::vector<SegmentInfo> snapshot() const;
  // A table of the main stats and per-category bytes, for logs.
  std::string summary() const;

  // Expires when this allocator is destroyed: a Buffer that outlives it
  // (a caller's bug, reported at the allocator's destruction) then leaves its
  // memory with the allocator's leaked segments instead of freeing into a
  // destroyed allocator.
  std::weak_ptr<const void> lifetime() const { return lifetime_.watch(); }

 private:
  Block* find_free_block(BlockPool& pool, const Stream& stream, size_t size);
  Block* alloc_segment(BlockPool& pool, const Stream& stream, size_t segment_size);
  Block* split_block(Block* block, size_t size);
  void free_block(Block* block);
  void try_merge(Block* block, Block* neighbour);
  void release_cached_segments();
  void release_segment(Block* block);
  void process_events();
  void synchronize_and_process_events();
  bool should_split(const Block* block, size_t size) const;
  Block* new_block(const Stream& stream, BlockPool* pool, void* ptr, size_t size);
  void recycle_block(Block* block);
  void track_allocated(Block* block);
  void pool_insert(Block* block);
  void pool_erase(Block* block);
  [[noreturn]] void throw_oom(size_t size, size_t segment_size, MemoryCategory category,
                              const char* file, int line);

  static size_t round_size(size_t size);
  static size_t segment_size_for(size_t rounded);
  Stat& pool_stat(StatArray& array, const BlockPool& pool);
  void update_stat(StatArray& array, const BlockPool& pool, int64_t delta);

  const Device device_;
  const AllocatorConfig config_;
  std::unique_ptr<RawAllocator> raw_;
  std::unique_ptr<StreamEvents> events_;

  mutable std::mutex mutex_;
  BlockPool small_pool_{true};
  BlockPool large_pool_{false};
  std::unordered_map<void*, Block*> allocated_;
  std::vector<std::unordered_map<void*, Block*>::node_type> spare_map_nodes_;
  std::vector<Block*> spare_blocks_;
  struct PendingEvent {
    StreamEvents::Token token;
    Block* block;
  };
  std::vector<PendingEvent> pending_;
  AllocatorStats stats_;
  Lifetime lifetime_;
};

// Owns one allocation; returns it to its allocator when destroyed or reset.
class Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator* allocator, void* ptr, size_t size_bytes)
      : allocator_(allocator),
        allocator_alive_(allocator != nullptr ? allocator->lifetime() : std::weak_ptr<const void>()),
        ptr_(ptr),
        size_bytes_(size_bytes) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept;
  Buffer& operator=(Buffer&& other) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void* data() const { return ptr_; }
  size_t size_bytes() const { return size_bytes_; }
  explicit operator bool() const { return ptr_ != nullptr; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  void reset() noexcept;

 private:
  CachingAllocator* allocator_ = nullptr;
  std::weak_ptr<const void> allocator_alive_;
  void* ptr_ = nullptr;
  size_t size_bytes_ = 0;
};

}  // namespace zest
