// Internal (not installed): offload_optimizer device "nvme". The host part
// of OptimizerOffload (its master weights and optimizer state) lives in one
// swap file per rank under nvme_path instead of host memory, and the step
// streams it through a ring of buffer_count aligned host buffers
// (nvme/swap_ring.h): the next chunks are read while the host optimizer
// updates this one and the previous one is written back.
//
// Note [offload swap layout]: the file holds the host part in records of
// one pipeline chunk (OptimizerOffload::chunk_numel() elements): the
// chunk's master weights, then each state buffer, the record padded to the
// file's alignment. One record is one ring buffer, so the update of a chunk
// finds its master and state side by side in one transfer each way. A
// chunk is at most 4M elements (optimizer_offload.cpp): with fp32 master and
// two fp32 states a record of 48 MiB, so the ring's host memory is at most
// buffer_count x 48 MiB (192 MiB at DeepSpeed's default of 4).
//
// Note [swap ring in the host allocator]: the ring's buffers are one block
// of the host caching allocator (comm_buffers), buffer_count records and
// the file's alignment more to align them in it, so that the host's budget
// (a capacity-limited host allocator, as a smaller host would be) and its
// statistics count them as they count the copies' slots. read() and
// write(), which run between steps, stage their records in the ring's
// first buffer: no memory of their own.
//
// Note [offload swap regions]: the file has two regions of the records;
// one holds the current values. A step reads it and writes the new values
// to the other (SwapRing::stream_to), and switches to that one only once
// every write has landed. A step that fails (an I/O error, a short read, a
// full disk) throws with the current region whole: the master weights and
// state are those before the step. The price is twice the host part's bytes
// on the drive.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "zest/core/dtype.h"
#include "zest/memory/caching_allocator.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/aio_config.h"
#include "zest/nvme/swap_file.h"
#include "zest/nvme/swap_ring.h"

namespace zest {

// The swap files' records and slots are laid out before a file exists, for
// direct I/O's usual alignment of 4096 bytes; a file system that asks more
// (SwapFile::alignment) is refused by name when the file is opened.
inline constexpr size_t kAssumedSwapAlignment = 4096;

struct OffloadSwapConfig {
  std::string nvme_path;  // the directory of the swap file (must exist)
  int buffer_count = 4;   // the ring's buffers
  int rank = 0;           // in the file's name
  AioConfig aio;
  // Test seam: the I/O engine (when null: set_offload_swap_io's, else
  // make_aio_backend(aio)).
  std::shared_ptr<AioBackend> io;
};

// Test seam: the I/O engine of the swap files OffloadSwap and ParamSwap
// (engine/detail/param_swap.h) make from now on in this process (an Engine's,
// whose config has no place for one), for tests that inject failures; an
// empty function restores make_aio_backend.
void set_offload_swap_io(std::function<std::shared_ptr<AioBackend>()> make);
// The I/O engine of a new swap file: the test seam's, else
// make_aio_backend(aio).
std::shared_ptr<AioBackend> make_swap_io(const AioConfig& aio);

class OffloadSwap {
 public:
  // The host part: numel elements in chunks of chunk_numel; buffer 0 the
  // master weights (of `master`), 1..state_buffers the state (of `state`),
  // all zero at first. The ring's memory comes from `host` (Note [swap
  // ring in the host allocator]).
  OffloadSwap(const OffloadSwapConfig& config, CachingAllocator& host, size_t numel, size_t chunk_numel,
              int state_buffers, DType master, DType state);

  // Where chunk `chunk` (its first element chunk * chunk_numel) keeps buffer
  // b, inside the ring's buffer that holds it.
  using Chunk = std::array<std::byte*, 3>;
  // Streams every chunk, in order, through `update`, which changes its
  // values in place; the new values become the current ones once all are
  // written (Note [offload swap regions]).
  void update(const std::function<void(size_t chunk, const Chunk& buffers)>& update);

  // The values before the last update() current again: the region it read
  // is untouched until the next update() or write() (Note [offload swap
  // regions]), so a step that succeeded here and failed on another rank is
  // undone (Note [an NVMe step agreed across ranks], engine_step.cpp). Only
  // right after an update().
  void roll_back();

  // Elements [a, b) of buffer `buffer`, to or from host memory of its dtype.
  void read(int buffer, size_t a, size_t b, std::byte* out);
  void write(int buffer, size_t a, size_t b, const std::byte* in);

  const std::string& path() const { return file_.path(); }
  // The file's bytes: both regions, and of them the master weights' fields
  // (the rest is the state buffers and the records' alignment padding).
  uint64_t file_bytes() const { return 2 * region_bytes_; }
  uint64_t master_file_bytes() const { return 2 * records_ * chunk_ * elem_size(master_); }
  // Host memory of the ring's buffers: of the host allocator's
  // comm_buffers, the block that holds them (Note [swap ring in the host
  // allocator]).
  uint64_t host_buffer_bytes() const { return memory_.size_bytes(); }
  // Where the last update()'s time went (nvme/swap_ring.h).
  const SwapRingTimes& times() const { return ring_.times(); }

 private:
  uint64_t region(int r) const { return static_cast<uint64_t>(r) * region_bytes_; }
  size_t field(int buffer) const { return field_[static_cast<size_t>(buffer)]; }
  size_t esize(int buffer) const { return buffer == 0 ? elem_size(master_) : elem_size(state_); }
  // Reads record r of the current region into record_, or writes it back.
  void transfer(AioOp op, size_t record);
  // Elements [a, b) of `buffer`, record by record: fn(record, first
  // element, count, bytes of the record where element first lies).
  template <typename Fn>
  void each_record(int buffer, size_t a, size_t b, Fn&& fn);

  size_t numel_, chunk_;
  int buffers_;
  DType master_, state_;
  std::array<size_t, 3> field_{};  // byte offsets in a record
  size_t record_bytes_ = 0;
  size_t records_ = 0;
  uint64_t region_bytes_ = 0;
  int current_ = 0;  // the region holding the current values
  bool can_roll_back_ = false;  // the other region holds the values before the last update()
  std::shared_ptr<AioBackend> io_;
  SwapFile file_;
  Buffer memory_;  // the ring's buffers (Note [swap ring in the host allocator])
  SwapRing ring_;
  std::byte* staging_ = nullptr;  // one record, for read() and write(): the ring's first buffer
};

}  // namespace zest
