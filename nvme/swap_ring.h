// A bounded ring of aligned host buffers that streams a region of a swap
// file through memory: the next chunks are read while the caller works on
// this one, and the previous ones are written back meanwhile. The optimizer
// step of the NVMe tier runs its update this way, chunk by chunk:
//
//   // zest-example: run
//   std::filesystem::create_directories("swap");
//   zest::SwapFile file = zest::SwapFile::create("swap", {.bytes = 8 << 20});
//   std::unique_ptr<zest::AioBackend> io = zest::make_aio_backend(zest::AioConfig{});
//   zest::SwapRing ring(file, *io, {.buffer_count = 4, .buffer_size = 1 << 20});
//   ring.stream(0, 8 << 20, zest::StreamMode::kReadWrite,
//               [](int64_t chunk, uint64_t offset, std::span<std::byte> data) {
//                 (void)chunk, (void)offset;
//                 for (std::byte& b : data) b = ~b;  // the update of this chunk
//               });
//
// Note [swap ring order]: with B buffers, chunk k lives in buffer k % B and
// the ring runs, for each chunk k:
//   wait read(k); compute(k); submit write(k);
//   wait write(k + B - 1 - B) = write(k - 1); submit read(k + B - 1)
// so B - 1 reads are ahead of the computation and one write behind it (B = 1
// runs read, compute, write one after another). Read k + B - 1 goes into
// the buffer of write k - 1, so it is submitted after compute(k): with B = 2
// no read is in flight during a computation (only the write behind it), and
// the reads overlap the computation from B = 3 on (bench/offload_bench
// --nvme measured 3% of the update hidden at B = 2, all of it at 3 and 4:
// docs/BENCHMARKS.md). A buffer has at most one
// transfer in flight, so buffer_count x buffer_size bounds the host memory.
// kRead skips the writes, kWrite the reads (the caller fills each chunk).
//
// Failures: an I/O error, a short read or an exception from the callback
// stops the stream after every transfer in flight has finished (the kernel
// must be done with the buffers), and throws (check_io's message: the file,
// the operation, the offset, the bytes). The callback has then run, in
// order, for exactly the chunks before a failed read (never for its chunk),
// or, for a failed write, for the chunks computed before its failure was
// seen (at most buffer_count - 1 past it). The file's region may be partly
// written: a caller that needs the previous state whole writes elsewhere
// and switches over after success: stream_to reads one region and writes
// the new values to another, so the region read keeps the previous state
// whole whatever fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "zest/nvme/aio_backend.h"

namespace zest {

class RawAllocator;
class SwapFile;

struct SwapRingConfig {
  int buffer_count = 4;           // offload_optimizer.buffer_count's default
  size_t buffer_size = 1 << 20;   // rounded up to the file's alignment
};

enum class StreamMode { kRead, kReadWrite, kWrite };

// One step of the ring, for tests of its order (set_trace).
struct RingEvent {
  enum Kind { kSubmitRead, kWaitRead, kCompute, kSubmitWrite, kWaitWrite };
  Kind kind;
  int64_t chunk;
  bool operator==(const RingEvent&) const = default;
};

// Where a stream's time went (seconds): blocked on reads, in the callback,
// blocked on writes. With full overlap the waits are near zero.
//
// compute_overlapped: of `compute`, the callbacks during which the drive
// was busy throughout: a transfer submitted before the callback began was
// still in flight after it ended (the first wait for it after the callback
// blocked, longer than kBlockedWait). A lower bound of the computation the
// I/O hid under it, measured in the stream itself, so a drive whose speed
// drifts between runs does not blur it.
struct SwapRingTimes {
  double wait_read = 0, compute = 0, wait_write = 0;
  double compute_overlapped = 0;
};

class SwapRing {
 public:
  // Allocates the buffers (from `allocator` where given: e.g. pinned host
  // memory; see AlignedHostBuffer). Throws zest::Error for buffer_count
  // below 1 or buffer_size 0.
  SwapRing(SwapFile& file, AioBackend& io, SwapRingConfig config, RawAllocator* allocator = nullptr);
  // The buffers carved from `memory`, the caller's (e.g. a block of the
  // host caching allocator, so that a host budget counts them); it must
  // hold buffer_count buffers of buffer_size rounded up to the file's
  // alignment, start at a multiple of it, and outlive the ring. Throws
  // zest::Error otherwise.
  SwapRing(SwapFile& file, AioBackend& io, SwapRingConfig config, std::span<std::byte> memory);

  using ChunkFn = std::function<void(int64_t chunk, uint64_t file_offset, std::span<std::byte> data)>;
  // Streams [offset, offset + bytes) of the file in chunks of buffer_size()
  // (the last one shorter). `offset` must be a multiple of the file's
  // alignment and the region, rounded up to it, inside the file.
  void stream(uint64_t offset, uint64_t bytes, StreamMode mode, const ChunkFn& fn);
  // kReadWrite from [read_offset, + bytes) into [write_offset, + bytes)
  // (regions of the same rules that do not overlap); `fn` gets the read
  // offset.
  void stream_to(uint64_t read_offset, uint64_t write_offset, uint64_t bytes, const ChunkFn& fn);

  size_t buffer_size() const { return buffer_size_; }
  int buffer_count() const { return static_cast<int>(buffers_.size()); }
  // Buffer i's memory, for a caller's own transfers between streams (none
  // is in flight then).
  std::span<std::byte> buffer(int i) const {
    return {buffers_[static_cast<size_t>(i)], buffer_size_};
  }
  const SwapRingTimes& times() const { return times_; }  // of the last stream
  void set_trace(std::vector<RingEvent>* trace) { trace_ = trace; }

 private:
  struct Slot {
    std::optional<AioHandle> handle;
    int64_t computes_before = 0;  // callbacks begun before its submission
    AioOp op = AioOp::kRead;
    int64_t chunk = 0;
    uint64_t offset = 0;
    size_t bytes = 0;
  };
  void submit(int64_t chunk, AioOp op, uint64_t offset, size_t io_bytes);
  void wait(int64_t chunk);
  void drain() noexcept;
  void check_region(uint64_t offset, uint64_t bytes) const;
  void run(uint64_t read_offset, uint64_t write_offset, uint64_t bytes, StreamMode mode, const ChunkFn& fn);
  void note(RingEvent::Kind kind, int64_t chunk) {
    if (trace_) trace_->push_back({kind, chunk});
  }

  SwapFile& file_;
  AioBackend& io_;
  size_t buffer_size_;
  std::vector<AlignedHostBuffer> owned_;  // empty where the memory is the caller's
  std::vector<std::byte*> buffers_;
  std::vector<Slot> slots_;
  std::vector<RingEvent>* trace_ = nullptr;
  SwapRingTimes times_;
  // The last callback (its index among the stream's callbacks and its
  // seconds) while no wait has shown the drive busy throughout it.
  int64_t computes_ = 0;
  double unproven_compute_ = 0;
};

}  // namespace zest
