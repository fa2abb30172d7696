#include "zest/nvme/swap_ring.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <utility>

#include "zest/core/check.h"
#include "zest/nvme/swap_file.h"

namespace zest {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// A wait longer than this blocked: the transfer was in flight when it began
// (a finished one returns in microseconds).
constexpr double kBlockedWait = 50e-6;

}  // namespace

SwapRing::SwapRing(SwapFile& file, AioBackend& io, SwapRingConfig config, RawAllocator* allocator)
    : file_(file), io_(io) {
  ZEST_CHECK(config.buffer_count >= 1, "the NVMe tier's buffer_count is {}: it must be at least 1 (DeepSpeed's "
             "default is 4; 2 or more overlap I/O with compute)", config.buffer_count);
  ZEST_CHECK(config.buffer_size > 0, "the NVMe tier's buffer_size is 0: it must be a positive number of bytes");
  const size_t a = file.alignment();
  buffer_size_ = (config.buffer_size + a - 1) / a * a;
  owned_.reserve(static_cast<size_t>(config.buffer_count));
  for (int i = 0; i < config.buffer_count; ++i) {
    owned_.emplace_back(buffer_size_, a, allocator);
    buffers_.push_back(owned_.back().data());
  }
  slots_.resize(buffers_.size());
}

SwapRing::SwapRing(SwapFile& file, AioBackend& io, SwapRingConfig config, std::span<std::byte> memory)
    : file_(file), io_(io) {
  ZEST_CHECK(config.buffer_count >= 1, "the NVMe tier's buffer_count is {}: it must be at least 1 (DeepSpeed's "
             "default is 4; 2 or more overlap I/O with compute)", config.buffer_count);
  ZEST_CHECK(config.buffer_size > 0, "the NVMe tier's buffer_size is 0: it must be a positive number of bytes");
  const size_t a = file.alignment();
  buffer_size_ = (config.buffer_size + a - 1) / a * a;
  const size_t count = static_cast<size_t>(config.buffer_count);
  ZEST_CHECK(reinterpret_cast<uintptr_t>(memory.data()) % a == 0 && memory.size() / buffer_size_ >= count,
             "the swap ring of {} was given {} bytes at {}: it needs {} buffers of {} bytes at a multiple of {}",
             file.path(), memory.size(), static_cast<const void*>(memory.data()), count, buffer_size_, a);
  for (size_t i = 0; i < count; ++i) buffers_.push_back(memory.data() + i * buffer_size_);
  slots_.resize(buffers_.size());
}

void SwapRing::submit(int64_t chunk, AioOp op, uint64_t offset, size_t io_bytes) {
  Slot& s = slots_[static_cast<size_t>(chunk) % slots_.size()];
  ZEST_INTERNAL_ASSERT(!s.handle, "swap ring buffer of chunk {} still busy", chunk);
  note(op == AioOp::kRead ? RingEvent::kSubmitRead : RingEvent::kSubmitWrite, chunk);
  s.handle = io_.submit({op, file_.fd(), buffers_[static_cast<size_t>(chunk) % buffers_.size()], io_bytes, offset});
  s.op = op;
  s.computes_before = computes_;
  s.chunk = chunk;
  s.offset = offset;
  s.bytes = io_bytes;
}

void SwapRing::wait(int64_t chunk) {
  if (chunk < 0) return;
  Slot& s = slots_[static_cast<size_t>(chunk) % slots_.size()];
  if (!s.handle) return;
  ZEST_INTERNAL_ASSERT(s.chunk == chunk, "swap ring: waiting for chunk {} in the buffer of chunk {}", chunk, s.chunk);
  note(s.op == AioOp::kRead ? RingEvent::kWaitRead : RingEvent::kWaitWrite, chunk);
  const Clock::time_point t0 = Clock::now();
  const AioResult r = io_.wait(*s.handle);
  s.handle.reset();
  const double waited = seconds_since(t0);
  (s.op == AioOp::kRead ? times_.wait_read : times_.wait_write) += waited;
  // Submitted before the last callback began and in flight after it ended:
  // the drive was busy throughout it.
  if (unproven_compute_ > 0 && s.computes_before < computes_ && waited > kBlockedWait) {
    times_.compute_overlapped += std::exchange(unproven_compute_, 0.0);
  }
  check_io(r, file_, s.op, s.offset, s.bytes);
}

void SwapRing::drain() noexcept {
  for (Slot& s : slots_) {
    if (s.handle) {
      try {
        io_.wait(*s.handle);
      } catch (...) {
        // A back end that cannot wait any more (its queue failed) has
        // nothing of this transfer in flight; the first error is the one
        // that propagates.
      }
      s.handle.reset();
    }
  }
}

void SwapRing::check_region(uint64_t offset, uint64_t bytes) const {
  const size_t a = file_.alignment();
  const uint64_t padded = (bytes + a - 1) / a * a;
  ZEST_CHECK(offset % a == 0 && offset <= file_.size() && padded <= file_.size() - offset,
             "cannot stream {} bytes at offset {} of the NVMe swap file {} ({} bytes): the offset must be a "
             "multiple of {} and the region inside the file",
             bytes, offset, file_.path(), file_.size(), a);
}

void SwapRing::stream(uint64_t offset, uint64_t bytes, StreamMode mode, const ChunkFn& fn) {
  check_region(offset, bytes);
  run(offset, offset, bytes, mode, fn);
}

void SwapRing::stream_to(uint64_t read_offset, uint64_t write_offset, uint64_t bytes, const ChunkFn& fn) {
  check_region(read_offset, bytes);
  check_region(write_offset, bytes);
  const size_t a = file_.alignment();
  const uint64_t padded = (bytes + a - 1) / a * a;
  ZEST_CHECK(read_offset + padded <= write_offset || write_offset + padded <= read_offset,
             "cannot stream {} bytes of the NVMe swap file {} from offset {} to offset {}: the regions overlap",
             bytes, file_.path(), read_offset, write_offset);
  run(read_offset, write_offset, bytes, StreamMode::kReadWrite, fn);
}

void SwapRing::run(uint64_t offset, uint64_t write_offset, uint64_t bytes, StreamMode mode, const ChunkFn& fn) {
  const size_t a = file_.alignment();
  times_ = {};
  computes_ = 0;
  unproven_compute_ = 0;
  if (bytes == 0) return;
  const int64_t n = static_cast<int64_t>((bytes + buffer_size_ - 1) / buffer_size_);
  const int64_t count = static_cast<int64_t>(buffers_.size());
  const int64_t ahead = std::max<int64_t>(count - 1, 1);
  const bool reads = mode != StreamMode::kWrite;
  const bool writes = mode != StreamMode::kRead;
  auto chunk_offset = [&](int64_t k) { return offset + static_cast<uint64_t>(k) * buffer_size_; };
  auto write_at = [&](int64_t k) { return write_offset + static_cast<uint64_t>(k) * buffer_size_; };
  auto chunk_bytes = [&](int64_t k) {
    return static_cast<size_t>(std::min<uint64_t>(buffer_size_, bytes - static_cast<uint64_t>(k) * buffer_size_));
  };
  auto io_bytes = [&](int64_t k) { return (chunk_bytes(k) + a - 1) / a * a; };
  try {
    if (reads) {
      for (int64_t j = 0; j < std::min(ahead, n); ++j) submit(j, AioOp::kRead, chunk_offset(j), io_bytes(j));
    }
    for (int64_t k = 0; k < n; ++k) {
      std::byte* data = buffers_[static_cast<size_t>(k % count)];
      if (reads) {
        wait(k);
      } else {
        wait(k - count);  // the buffer's previous write; none for k < count
        // The padding past the last chunk's bytes is written too: zeros.
        std::memset(data + chunk_bytes(k), 0, io_bytes(k) - chunk_bytes(k));
      }
      note(RingEvent::kCompute, k);
      const Clock::time_point t0 = Clock::now();
      ++computes_;
      fn(k, chunk_offset(k), std::span<std::byte>(data, chunk_bytes(k)));
      unproven_compute_ = seconds_since(t0);
      times_.compute += unproven_compute_;
      if (writes) submit(k, AioOp::kWrite, write_at(k), io_bytes(k));
      const int64_t j = k + ahead;
      if (reads && j < n) {
        if (writes && j - count >= 0) wait(j - count);
        submit(j, AioOp::kRead, chunk_offset(j), io_bytes(j));
      }
    }
    for (int64_t k = std::max<int64_t>(n - count, 0); k < n; ++k) wait(k);
  } catch (...) {
    drain();
    throw;
  }
}

}  // namespace zest
