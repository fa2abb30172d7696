// Policies of the caching allocator (the same as PyTorch's CUDA caching
// allocator, so that knowledge of one carries to the other):
//
// - Sizes round up to 512 bytes. Requests up to 1 MiB come from the small
//   pool, carved out of 2 MiB segments; 1-10 MiB requests carve a 20 MiB
//   segment; larger ones get a segment of their own rounded up to 2 MiB.
// - Free blocks are found by best fit in a set ordered by (stream, size,
//   address). A block is reused only on the stream it was allocated on, so no
//   synchronization is ever needed for single-stream use.
// - A found block is split when the rest is at least 512 B (small pool), or
//   more than 1 MiB and the request is below max_split_size (large pool).
//   Blocks of max_split_size or more are not split and not handed to smaller
//   requests (see AllocatorConfig).
// - A freed block merges with free neighbours in its segment.
// - A block that record_stream() marked as used on other streams is held back
//   when freed until an event recorded on each of those streams at free time
//   has completed ("pending free").
// - When the raw allocator has no memory: wait for pending frees, retry the
//   cache, return every free whole segment to the raw allocator, retry the raw
//   allocation, and only then fail with a message that tells fragmentation
//   ("reserved but unallocated", largest free block) from real exhaustion.
#include "zest/memory/caching_allocator.h"

#include <algorithm>
#include <map>
#include <utility>

#include "zest/core/leak_check.h"
#include "zest/core/logging.h"

namespace zest {
namespace {

bool is_free(const Block* b) { return b != nullptr && !b->allocated && b->pending_events == 0; }

}  // namespace

CachingAllocator::CachingAllocator(std::unique_ptr<RawAllocator> raw, AllocatorConfig config,
                                   std::unique_ptr<StreamEvents> events)
    : device_(raw ? raw->device() : Device::host()),
      config_(config),
      raw_(std::move(raw)),
      events_(events ? std::move(events) : make_device_stream_events()) {
  ZEST_CHECK(raw_ != nullptr, "CachingAllocator needs a raw allocator (e.g. make_host_allocator())");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    synchronize_and_process_events();
  } catch (const Error& e) {
    ZEST_LOG_WARN("caching allocator on {}: waiting for stream events at destruction failed: {}",
                  device_.str(), e.what());
  }
  release_cached_segments();
  if (!allocated_.empty()) {
    // Freeing them would turn the caller's bug into a use-after-free; keep the
    // segments and say so.
    ZEST_LOG_WARN("caching allocator on {} destroyed with {} allocation(s) ({}) still live; their "
                  "segments are leaked. Destroy what holds them (Buffers, an Engine) before "
                  "their allocator",
                  device_.str(), allocated_.size(),
                  format_bytes(at(stats_.allocated_bytes, StatPool::kAggregate).current));
    for (const auto& [ptr, block] : allocated_) {
      Block* first = block;
      while (first->prev != nullptr) first = first->prev;
      if (device_.is_host()) keep_on_purpose(first->ptr);  // the segment's base
      for (Block* b = first; b != nullptr; b = b->next) keep_on_purpose(b);
    }
  }
  for (Block* b : spare_blocks_) delete b;
}

size_t CachingAllocator::round_size(size_t size) {
  return size < kMinBlockSize ? kMinBlockSize : round_up(size, kMinBlockSize);
}

size_t CachingAllocator::segment_size_for(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return round_up(rounded, kRoundLarge);
}

Stat& CachingAllocator::pool_stat(StatArray& array, const BlockPool& pool) {
  return array[static_cast<size_t>(pool.is_small ? StatPool::kSmall : StatPool::kLarge)];
}

void CachingAllocator::update_stat(StatArray& array, const BlockPool& pool, int64_t delta) {
  Stat& aggregate = array[static_cast<size_t>(StatPool::kAggregate)];
  Stat& per_pool = pool_stat(array, pool);
  if (delta >= 0) {
    aggregate.increase(delta);
    per_pool.increase(delta);
  } else {
    aggregate.decrease(-delta);
    per_pool.decrease(-delta);
  }
}

void CachingAllocator::pool_insert(Block* block) {
  block->pool->insert(block);
  if (block->is_split()) {
    update_stat(stats_.inactive_split, *block->pool, 1);
    update_stat(stats_.inactive_split_bytes, *block->pool, static_cast<int64_t>(block->size));
  }
}

void CachingAllocator::pool_erase(Block* block) {
  const bool erased = block->pool->erase(block);
  ZEST_INTERNAL_ASSERT(erased, "block missing from its pool");
  if (block->is_split()) {
    update_stat(stats_.inactive_split, *block->pool, -1);
    update_stat(stats_.inactive_split_bytes, *block->pool, -static_cast<int64_t>(block->size));
  }
}

// Block objects and map nodes are recycled rather than freed, for the same
// reason as the pools' set nodes: no heap traffic on a cache hit.
Block* CachingAllocator::new_block(const Stream& stream, BlockPool* pool, void* ptr, size_t size) {
  if (spare_blocks_.empty()) return new Block(stream, pool, ptr, size);
  Block* b = spare_blocks_.back();
  spare_blocks_.pop_back();
  b->stream = stream;
  b->pool = pool;
  b->ptr = ptr;
  b->size = size;
  return b;
}

void CachingAllocator::recycle_block(Block* block) {
  block->requested_size = 0;
  block->category = MemoryCategory::kOther;
  block->allocated = false;
  block->pending_events = 0;
  block->stream_uses.clear();
  block->prev = nullptr;
  block->next = nullptr;
  spare_blocks_.push_back(block);
}

void CachingAllocator::track_allocated(Block* block) {
  if (spare_map_nodes_.empty()) {
    allocated_.emplace(block->ptr, block);
    return;
  }
  auto node = std::move(spare_map_nodes_.back());
  spare_map_nodes_.pop_back();
  node.key() = block->ptr;
  node.mapped() = block;
  allocated_.insert(std::move(node));
}

void* CachingAllocator::allocate(size_t size_bytes, const Stream& stream, MemoryCategory category) {
  ZEST_CHECK(size_bytes > 0,
             "allocation of 0 bytes requested for {} on {}; ask for at least one byte (an empty "
             "tensor needs no buffer)", category_name(category), device_.str());
  ZEST_CHECK(size_bytes <= kMaxRequestBytes,
             "allocation of {} bytes requested for {} on {} is larger than any device (limit "
             "2^56 bytes); the size is probably a negative number or an overflowed product",
             size_bytes, category_name(category), device_.str());
  ZEST_CHECK(stream.device() == device_,
             "allocation on {} requested with a stream of {}; use a stream of the allocator's "
             "device", device_.str(), stream.device().str());

  std::lock_guard<std::mutex> lock(mutex_);
  process_events();

  const size_t rounded = round_size(size_bytes);
  BlockPool& pool = rounded <= kSmallSize ? small_pool_ : large_pool_;
  const size_t segment_size = segment_size_for(rounded);

  Block* block = find_free_block(pool, stream, rounded);
  if (block == nullptr) block = alloc_segment(pool, stream, segment_size);
  if (block == nullptr) {
    ++stats_.num_alloc_retries;
    // Blocks held back for other streams may be free by now, or soon.
    synchronize_and_process_events();
    block = find_free_block(pool, stream, rounded);
    if (block == nullptr) {
      release_cached_segments();
      block = alloc_segment(pool, stream, segment_size);
    }
  }
  if (block == nullptr) {
    ++stats_.num_ooms;
    throw_oom(size_bytes, segment_size, category, __FILE__, __LINE__);
  }

  if (should_split(block, rounded)) block = split_block(block, rounded);
  block->allocated = true;
  block->requested_size = size_bytes;
  block->category = category;
  track_allocated(block);

  const auto size = static_cast<int64_t>(block->size);
  update_stat(stats_.allocation, pool, 1);
  update_stat(stats_.allocated_bytes, pool, size);
  update_stat(stats_.active, pool, 1);
  update_stat(stats_.active_bytes, pool, size);
  update_stat(stats_.requested_bytes, pool, static_cast<int64_t>(size_bytes));
  stats_.category_requested_bytes[category_index(category)].increase(static_cast<int64_t>(size_bytes));
  stats_.category_allocated_bytes[category_index(category)].increase(size);
  return block->ptr;
}

Block* CachingAllocator::find_free_block(BlockPool& pool, const Stream& stream, size_t size) {
  Block key(stream, &pool, nullptr, size);
  auto it = pool.blocks.lower_bound(&key);
  if (it == pool.blocks.end() || (*it)->stream.id() != stream.id()) return nullptr;
  Block* block = *it;
  // Keep oversize blocks whole for large requests, and do not hand a large
  // request a block so much bigger that most of it would be wasted.
  if (size < config_.max_split_size && block->size >= config_.max_split_size) return nullptr;
  if (size >= config_.max_split_size && block->size >= size + kLargeBuffer) return nullptr;
  pool_erase(block);
  return block;
}

Block* CachingAllocator::alloc_segment(BlockPool& pool, const Stream& stream, size_t segment_size) {
  void* ptr = raw_->allocate(segment_size);
  if (ptr == nullptr) return nullptr;
  ++stats_.num_raw_allocs;
  update_stat(stats_.segment, pool, 1);
  update_stat(stats_.reserved_bytes, pool, static_cast<int64_t>(segment_size));
  return new_block(stream, &pool, ptr, segment_size);
}

bool CachingAllocator::should_split(const Block* block, size_t size) const {
  const size_t remaining = block->size - size;
  if (block->pool->is_small) return remaining >= kMinBlockSize;
  return size < config_.max_split_size && remaining > kSmallSize;
}

// Cuts `block` (out of the pool) into `size` bytes, returned, and the rest,
// which goes back to the pool.
Block* CachingAllocator::split_block(Block* block, size_t size) {
  Block* rest = new_block(block->stream, block->pool, static_cast<char*>(block->ptr) + size,
                          block->size - size);
  rest->prev = block;
  rest->next = block->next;
  if (rest->next != nullptr) rest->next->prev = rest;
  block->next = rest;
  block->size = size;
  pool_insert(rest);
  return block;
}

void CachingAllocator::free(void* ptr) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  ZEST_CHECK(it != allocated_.end(),
             "free of {} on {}, which this allocator did not hand out or which was already "
             "freed", ptr, device_.str());
  Block* block = it->second;
  spare_map_nodes_.push_back(allocated_.extract(it));

  const BlockPool& pool = *block->pool;
  const auto size = static_cast<int64_t>(block->size);
  update_stat(stats_.allocation, pool, -1);
  update_stat(stats_.allocated_bytes, pool, -size);
  update_stat(stats_.requested_bytes, pool, -static_cast<int64_t>(block->requested_size));
  stats_.category_requested_bytes[category_index(block->category)].decrease(
      static_cast<int64_t>(block->requested_size));
  stats_.category_allocated_bytes[category_index(block->category)].decrease(size);
  block->allocated = false;
  block->requested_size = 0;

  if (block->stream_uses.empty()) {
    free_block(block);
    return;
  }
  // The other streams may still have work queued that reads or writes the
  // block: mark the end of each of their queues now, and reuse the block only
  // once all the marks are passed. The host never waits here.
  for (const Stream& s : block->stream_uses) {
    pending_.push_back({events_->record(s), block});
    ++block->pending_events;
  }
  block->stream_uses.clear();
  ++stats_.num_deferred_frees;
}

void CachingAllocator::record_stream(void* ptr, const Stream& stream) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = allocated_.find(ptr);
  ZEST_CHECK(it != allocated_.end(),
             "record_stream on {} on {}, which is not a live allocation of this allocator "
             "(pass the pointer allocate() returned, before freeing it)", ptr, device_.str());
  Block* block = it->second;
  if (stream == block->stream) return;  // the allocation stream is ordered already
  if (std::find(block->stream_uses.begin(), block->stream_uses.end(), stream) ==
      block->stream_uses.end()) {
    block->stream_uses.push_back(stream);
  }
}

// A block whose last user is done: merge with free neighbours, back to the pool.
void CachingAllocator::free_block(Block* block) {
  update_stat(stats_.active, *block->pool, -1);
  update_stat(stats_.active_bytes, *block->pool, -static_cast<int64_t>(block->size));
  try_merge(block, block->prev);
  try_merge(block, block->next);
  pool_insert(block);
}

void CachingAllocator::try_merge(Block* block, Block* neighbour) {
  if (!is_free(neighbour)) return;
  pool_erase(neighbour);
  if (neighbour == block->prev) {
    block->ptr = neighbour->ptr;
    block->prev = neighbour->prev;
    if (block->prev != nullptr) block->prev->next = block;
  } else {
    block->next = neighbour->next;
    if (block->next != nullptr) block->next->prev = block;
  }
  block->size += neighbour->size;
  recycle_block(neighbour);
}

void CachingAllocator::process_events() {
  if (pending_.empty()) return;
  std::vector<PendingEvent> still_pending;
  for (const PendingEvent& p : pending_) {
    if (!events_->completed(p.token)) {
      still_pending.push_back(p);
      continue;
    }
    events_->release(p.token);
    if (--p.block->pending_events == 0) free_block(p.block);
  }
  pending_.swap(still_pending);
}

void CachingAllocator::synchronize_and_process_events() {
  ++stats_.num_sync_all_streams;
  for (const PendingEvent& p : pending_) {
    events_->synchronize(p.token);
    events_->release(p.token);
    if (--p.block->pending_events == 0) free_block(p.block);
  }
  pending_.clear();
}

void CachingAllocator::release_cached_segments() {
  for (BlockPool* pool : {&small_pool_, &large_pool_}) {
    std::vector<Block*> whole;
    for (Block* b : pool->blocks) {
      if (!b->is_split()) whole.push_back(b);
    }
    for (Block* b : whole) release_segment(b);
  }
}

void CachingAllocator::release_segment(Block* block) {
  pool_erase(block);
  raw_->deallocate(block->ptr, block->size);
  ++stats_.num_raw_frees;
  update_stat(stats_.segment, *block->pool, -1);
  update_stat(stats_.reserved_bytes, *block->pool, -static_cast<int64_t>(block->size));
  recycle_block(block);
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  synchronize_and_process_events();
  release_cached_segments();
}

void CachingAllocator::throw_oom(size_t size, size_t segment_size, MemoryCategory category,
                                 const char* file, int line) {
  size_t largest_free = 0;
  size_t total_free = 0;
  for (const BlockPool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* b : pool->blocks) {
      largest_free = std::max(largest_free, b->size);
      total_free += b->size;
    }
  }
  const RawMemoryInfo info = raw_->memory_info();
  const int64_t reserved = at(stats_.reserved_bytes, StatPool::kAggregate).current;
  const int64_t allocated = at(stats_.allocated_bytes, StatPool::kAggregate).current;
  const double fragmentation =
      total_free == 0 ? 0.0 : 1.0 - static_cast<double>(largest_free) / static_cast<double>(total_free);
  std::string message = fmt::format(
      "out of memory on {} ({}): tried to allocate {} for {} (a {} segment). The device has {} "
      "in all and {} free; this allocator holds {} reserved, of which {} allocated and {} "
      "reserved but unallocated; the largest free cached block is {} (fragmentation {:.0f}%). ",
      device_.str(), raw_->name(), format_bytes(static_cast<int64_t>(size)),
      category_name(category), format_bytes(static_cast<int64_t>(segment_size)),
      format_bytes(static_cast<int64_t>(info.total_bytes)),
      format_bytes(static_cast<int64_t>(info.free_bytes)), format_bytes(reserved),
      format_bytes(allocated), format_bytes(reserved - allocated),
      format_bytes(static_cast<int64_t>(largest_free)), fragmentation * 100.0);
  // Fragmentation is the cause when the request would fit in what is free on
  // the device plus what the cache holds unallocated, were it contiguous.
  const auto unallocated = static_cast<size_t>(reserved - allocated);
  if (unallocated > 0 && unallocated + info.free_bytes >= segment_size) {
    message += "Reserved but unallocated memory is large: setting "
               "ZEST_ALLOC_CONF=max_split_size_mb:N (N > 20) limits fragmentation.";
  } else {
    message += "Reduce the batch size, or use a higher ZeRO stage or more ranks to shard more "
               "of the model state.";
  }
  throw OutOfMemoryError(std::move(message), file, line, size);
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (StatArray* a : {&stats_.allocation, &stats_.segment, &stats_.active, &stats_.inactive_split,
                       &stats_.allocated_bytes, &stats_.reserved_bytes, &stats_.active_bytes,
                       &stats_.inactive_split_bytes, &stats_.requested_bytes}) {
    for (Stat& s : *a) s.reset_peak();
  }
  for (Stat& s : stats_.category_requested_bytes) s.reset_peak();
  for (Stat& s : stats_.category_allocated_bytes) s.reset_peak();
}

std::vector<SegmentInfo> CachingAllocator::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  // Every block is in a pool, allocated, or pending; segment heads have no prev.
  std::map<uintptr_t, const Block*> heads;
  auto note = [&](const Block* b) {
    while (b->prev != nullptr) b = b->prev;
    heads.emplace(reinterpret_cast<uintptr_t>(b->ptr), b);
  };
  for (const BlockPool* pool : {&small_pool_, &large_pool_}) {
    for (const Block* b : pool->blocks) note(b);
  }
  for (const auto& [ptr, b] : allocated_) note(b);
  for (const PendingEvent& p : pending_) note(p.block);

  std::vector<SegmentInfo> segments;
  segments.reserve(heads.size());
  for (const auto& [address, head] : heads) {
    SegmentInfo seg;
    seg.address = address;
    seg.stream_id = head->stream.id();
    seg.is_small_pool = head->pool->is_small;
    for (const Block* b = head; b != nullptr; b = b->next) {
      BlockInfo info;
      info.size = b->size;
      info.requested_size = b->requested_size;
      info.category = b->category;
      info.state = b->allocated ? BlockState::kAllocated
                   : b->pending_events > 0 ? BlockState::kPendingFree
                                           : BlockState::kFree;
      seg.total_size += b->size;
      if (info.state == BlockState::kAllocated) seg.allocated_size += b->size;
      if (info.state != BlockState::kFree) seg.active_size += b->size;
      seg.blocks.push_back(info);
    }
    segments.push_back(std::move(seg));
  }
  return segments;
}

std::string CachingAllocator::summary() const {
  const AllocatorStats s = stats();
  auto row = [](std::string_view name, const Stat& st) {
    return fmt::format("  {:<22} {:>12} {:>12}\n", name, format_bytes(st.current), format_bytes(st.peak));
  };
  std::string out = fmt::format("memory on {} ({}):\n  {:<22} {:>12} {:>12}\n", device_.str(),
                                raw_->name(), "", "current", "peak");
  out += row("allocated", at(s.allocated_bytes, StatPool::kAggregate));
  out += row("reserved", at(s.reserved_bytes, StatPool::kAggregate));
  out += row("active", at(s.active_bytes, StatPool::kAggregate));
  out += row("inactive split", at(s.inactive_split_bytes, StatPool::kAggregate));
  for (MemoryCategory c : kAllMemoryCategories) {
    out += row(fmt::format("  {}", category_name(c)), s.category_requested(c));
  }
  out += fmt::format("  raw allocs {}, raw frees {}, retries {}, OOMs {}\n", s.num_raw_allocs,
                     s.num_raw_frees, s.num_alloc_retries, s.num_ooms);
  return out;
}

Buffer CachingAllocator::allocate_buffer(size_t size_bytes, const Stream& stream,
                                         MemoryCategory category) {
  return Buffer(this, allocate(size_bytes, stream, category), size_bytes);
}

Buffer::Buffer(Buffer&& other) noexcept
    : allocator_(std::exchange(other.allocator_, nullptr)),
      allocator_alive_(std::move(other.allocator_alive_)),
      ptr_(std::exchange(other.ptr_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
  if (this != &other) {
    reset();
    allocator_ = std::exchange(other.allocator_, nullptr);
    allocator_alive_ = std::move(other.allocator_alive_);
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
  }
  return *this;
}

void Buffer::reset() noexcept {
  // An allocator destroyed first kept this memory in its leaked segments
  // and said so; freeing into it would be a use-after-free.
  if (ptr_ != nullptr && allocator_ != nullptr && !allocator_alive_.expired()) {
    try {
      allocator_->free(ptr_);
    } catch (const Error& e) {
      ZEST_LOG_WARN("freeing a buffer of {} failed: {}", format_bytes(static_cast<int64_t>(size_bytes_)), e.what());
    }
  }
  allocator_ = nullptr;
  allocator_alive_.reset();
  ptr_ = nullptr;
  size_bytes_ = 0;
}

}  // namespace zest
