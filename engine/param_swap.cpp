#include "zest/engine/detail/param_swap.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/units.h"
#include "zest/engine/detail/offload_swap.h"

namespace zest {
namespace {

// Where each unit's slot begins in a region, and (last) the region's size.
std::vector<uint64_t> slot_offsets(const std::vector<size_t>& numel, size_t esize) {
  std::vector<uint64_t> at{0};
  for (const size_t n : numel) at.push_back(at.back() + round_up(n * esize, kAssumedSwapAlignment));
  return at;
}

}  // namespace

ParamSwap::ParamSwap(const ParamSwapConfig& config, CachingAllocator& host, std::vector<size_t> shard_numel)
    : numel_(std::move(shard_numel)),
      esize_(elem_size(config.dtype)),
      offset_(slot_offsets(numel_, esize_)),
      region_bytes_(offset_.back()),
      current_(numel_.size(), 0),
      pending_(numel_.size(), 0),
      io_(make_swap_io(config.aio)),
      file_(SwapFile::create(config.nvme_path, {.bytes = 2 * region_bytes_, .rank = config.rank})) {
  ZEST_CHECK(config.buffer_count >= 1,
             "zero_optimization.offload_param.buffer_count is {}: it must be at least 1 (DeepSpeed's default is 5; "
             "2 or more let the prefetcher read ahead)",
             config.buffer_count);
  const size_t largest = numel_.empty() ? 0 : *std::max_element(numel_.begin(), numel_.end());
  ZEST_INTERNAL_ASSERT(largest > 0 && largest <= config.buffer_numel, "parameter swap of {} elements, buffers of {}",
                       largest, config.buffer_numel);
  const size_t align = file_.alignment();
  for (size_t u = 0; u < numel_.size(); ++u) {
    ZEST_CHECK(offset_[u] % align == 0 && round_up(numel_[u] * esize_, kAssumedSwapAlignment) % align == 0,
               "NVMe swap file {}: the file system's direct I/O alignment is {} bytes, which the parameter shards' "
               "slots of multiples of {} bytes do not meet; use a drive with 4096-byte alignment, or "
               "offload_param.device \"cpu\"",
               file_.path(), align, kAssumedSwapAlignment);
  }
  buffer_bytes_ = round_up(largest * esize_, align);
  memory_ = host.allocate_buffer(static_cast<size_t>(config.buffer_count) * buffer_bytes_ + align,
                                 Stream::default_for(Device::host()), MemoryCategory::kCommBuffers);
  auto* p = memory_.as<std::byte>();
  p += (align - reinterpret_cast<uintptr_t>(p) % align) % align;
  for (int b = 0; b < config.buffer_count; ++b) buffers_.push_back(p + static_cast<size_t>(b) * buffer_bytes_);
  slots_.resize(buffers_.size());
}

ParamSwap::~ParamSwap() {
  // The kernel must be done with the buffers before they go. A back end
  // that cannot wait any more (its queue failed) has nothing in flight.
  for (Slot& s : slots_) {
    try {
      if (s.handle) (void)io_->wait(*s.handle);
    } catch (...) {
    }
  }
}

uint64_t ParamSwap::slot_offset(int unit, int region) const {
  return static_cast<uint64_t>(region) * region_bytes_ + offset_[idx(unit)];
}

int ParamSwap::buffer_of(int unit) const {
  for (size_t b = 0; b < slots_.size(); ++b) {
    if (slots_[b].state != State::kFree && slots_[b].unit == unit) return static_cast<int>(b);
  }
  return -1;
}

int ParamSwap::free_buffer() {
  for (size_t b = 0; b < slots_.size(); ++b) {
    if (slots_[b].state == State::kFree && static_cast<int>(b) != update_buffer_) return static_cast<int>(b);
  }
  return -1;
}

void ParamSwap::finish_read(int b) {
  Slot& s = slots_[static_cast<size_t>(b)];
  const AioResult r = io_->wait(*s.handle);
  s.handle.reset();
  const size_t bytes = round_up(bytes_of(s.unit), file_.alignment());
  if (r.ok(bytes)) return;
  const uint64_t offset = s.offset;
  s = Slot{};
  check_io(r, file_, AioOp::kRead, offset, bytes);
}

bool ParamSwap::start_read(int unit) {
  ZEST_INTERNAL_ASSERT(holds(unit), "unit {} has no shard in the parameter swap file", unit);
  flush();
  if (buffer_of(unit) >= 0) return true;
  const int b = free_buffer();
  if (b < 0) return false;
  Slot& s = slots_[static_cast<size_t>(b)];
  s.offset = slot_offset(unit, current_[idx(unit)]);
  s.handle = io_->submit(
      {AioOp::kRead, file_.fd(), buffer(b), round_up(bytes_of(unit), file_.alignment()), s.offset});
  s.state = State::kReading;
  s.unit = unit;
  return true;
}

std::span<const std::byte> ParamSwap::acquire(int unit) {
  flush();
  int b = buffer_of(unit);
  if (b < 0) {
    if (free_buffer() < 0) drop_reads();  // reads ahead give way to a gather off the recorded order
    const bool started = start_read(unit);
    ZEST_INTERNAL_ASSERT(started, "no free parameter swap buffer of {} for unit {}", slots_.size(), unit);
    b = buffer_of(unit);
  }
  Slot& s = slots_[static_cast<size_t>(b)];
  ZEST_INTERNAL_ASSERT(s.state != State::kHeld, "unit {}'s parameter swap buffer acquired twice", unit);
  finish_read(b);
  s.state = State::kHeld;
  return {buffer(b), bytes_of(unit)};
}

void ParamSwap::release(int unit) {
  const int b = buffer_of(unit);
  ZEST_INTERNAL_ASSERT(b >= 0 && slots_[static_cast<size_t>(b)].state == State::kHeld,
                       "release of unit {}'s parameter swap buffer, which it does not hold", unit);
  slots_[static_cast<size_t>(b)] = Slot{};
}

void ParamSwap::drop_reads() {
  flush();
  for (Slot& s : slots_) {
    if (s.state != State::kReading) continue;
    // A read ahead that failed is forgotten with its values: the gather
    // that needs them reads again, and reports what fails then.
    (void)io_->wait(*s.handle);
    s = Slot{};
  }
}

void ParamSwap::transfer(AioOp op, int unit, int region, std::byte* at) {
  const uint64_t offset = slot_offset(unit, region);
  const size_t bytes = round_up(bytes_of(unit), file_.alignment());
  check_io(io_->wait(io_->submit({op, file_.fd(), at, bytes, offset})), file_, op, offset, bytes);
}

void ParamSwap::read(int unit, size_t a, size_t b, std::byte* out) {
  ZEST_INTERNAL_ASSERT(a <= b && b <= numel_[idx(unit)], "[{}, {}) of a swapped shard of {}", a, b, numel_[idx(unit)]);
  const std::span<const std::byte> shard = acquire(unit);
  std::memcpy(out, shard.data() + a * esize_, (b - a) * esize_);
  release(unit);
}

void ParamSwap::write(int unit, size_t a, size_t b, const std::byte* in) {
  write_piece(unit, a, b, in);
  flush();
}

// Note [staged shard writes].
void ParamSwap::write_piece(int unit, size_t a, size_t b, const std::byte* in) {
  ZEST_INTERNAL_ASSERT(a <= b && b <= numel_[idx(unit)], "[{}, {}) of a swapped shard of {}", a, b, numel_[idx(unit)]);
  if (staged_ != unit) {
    flush();
    // The rest of the slot is read first: whole slots go to the file.
    (void)acquire(unit);
    staged_ = unit;
  }
  std::memcpy(buffer(buffer_of(unit)) + a * esize_, in, (b - a) * esize_);
}

void ParamSwap::flush() {
  if (staged_ < 0) return;
  const int unit = std::exchange(staged_, -1);
  try {
    transfer(AioOp::kWrite, unit, current_[idx(unit)], buffer(buffer_of(unit)));
  } catch (...) {
    release(unit);
    throw;
  }
  release(unit);
}

void ParamSwap::put_update(int unit, size_t at, const std::byte* values, size_t n) {
  flush();
  const size_t numel = numel_[idx(unit)];
  ZEST_INTERNAL_ASSERT(at + n <= numel && (at == 0) == (update_buffer_ < 0),
                       "unit {}'s new parameters [{}, {}) of {} out of order", unit, at, at + n, numel);
  if (at == 0) {
    // A read ahead of this unit holds the values before the step.
    if (const int b = buffer_of(unit); b >= 0 && slots_[static_cast<size_t>(b)].state == State::kReading) {
      (void)io_->wait(*slots_[static_cast<size_t>(b)].handle);
      slots_[static_cast<size_t>(b)] = Slot{};
    }
    if (free_buffer() < 0) drop_reads();
    update_buffer_ = free_buffer();
    ZEST_INTERNAL_ASSERT(update_buffer_ >= 0, "no free parameter swap buffer of {} for the step", slots_.size());
  }
  std::memcpy(buffer(update_buffer_) + at * esize_, values, n * esize_);
  if (at + n < numel) return;
  const int b = std::exchange(update_buffer_, -1);
  transfer(AioOp::kWrite, unit, 1 - current_[idx(unit)], buffer(b));
  pending_[idx(unit)] = 1;
}

void ParamSwap::commit() {
  drop_reads();  // of the slots before the step
  for (size_t u = 0; u < numel_.size(); ++u) {
    if (pending_[u] != 0) current_[u] = static_cast<uint8_t>(1 - current_[u]);
    pending_[u] = 0;
  }
}

void ParamSwap::discard() {
  flush();
  std::fill(pending_.begin(), pending_.end(), uint8_t{0});
  update_buffer_ = -1;
}

}  // namespace zest
