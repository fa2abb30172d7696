// Internal (not installed): offload_param device "nvme" at stage 3
// (ZeRO-Infinity's parameter tier). The compute-dtype parameter shards of
// the units gathered on demand that max_in_cpu leaves out of host memory
// live in one swap file per rank under offload_param.nvme_path. A gather
// reads the unit's shard into a buffer of a pool of buffer_count buffers of
// at most buffer_size elements, from which it goes to the device; the
// prefetcher reads the units next in the recorded order ahead, as far as
// free buffers allow (start_read); the optimizer step hands each unit's new
// shard over in order (put_update) and it is written back.
//
// DeepSpeed's semantics (AsyncPartitionedParameterSwapper and stage3.py's
// _create_param_groups_fp16_flat_cpu_memory), which the engine follows:
//   buffer_count  the pool's buffers: reads in flight and shards in use
//                 at once (a gather holds one until its shard is on the
//                 device).
//   buffer_size   elements of one buffer: a unit's shard on NVMe must fit
//                 one (DeepSpeed asserts it); the pool's buffers are sized
//                 to the largest such shard, so a default of 1e8 elements
//                 does not take 1e8 x 5 elements of host memory for a
//                 smaller model.
//   max_in_cpu    elements of the on-demand shards that stay in host
//                 memory: the units in registration order while their
//                 shards add up to at most max_in_cpu; every later one is on
//                 NVMe (DeepSpeed's flat CPU buffer of the first
//                 sub-groups).
//
// Note [parameter swap regions]: every unit has two slots in the file (two
// regions of the file, like engine/detail/offload_swap.h's); one holds its current
// values. The step's write-back goes to the other slot and becomes current
// only at commit(), which the engine calls once the whole step succeeded
// (on several ranks: once every rank's did). A failed step discards it: the
// current slots, whole, hold the parameters before the step, which is what
// the optimizer's roll back returns the master weights to. write(), for
// loads and restore(), writes the current slot in place.
//
// Note [parameter swap pool]: the buffers are one block of the host caching
// allocator (comm_buffers), as the optimizer's swap ring is, so that a
// limited host allocator's budget counts them. A buffer is free, reading
// (a read ahead in flight), or holding a unit's shard for its gather.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zest/core/dtype.h"
#include "zest/memory/caching_allocator.h"
#include "zest/nvme/aio_backend.h"
#include "zest/nvme/aio_config.h"
#include "zest/nvme/swap_file.h"

namespace zest {

struct ParamSwapConfig {
  std::string nvme_path;  // the directory of the swap file (must exist)
  int buffer_count = 5;
  size_t buffer_numel = 100'000'000;  // offload_param.buffer_size
  int rank = 0;                       // in the file's name
  DType dtype = DType::kFloat32;      // the parameters' (compute) dtype
  AioConfig aio;
};

class ParamSwap {
 public:
  // shard_numel[u]: the elements of unit u's shard in the file, 0 for a unit
  // not in it. Throws an Error naming offload_param.buffer_size (and the
  // value to set) for a shard larger than a buffer, and buffer_count for
  // fewer than one buffer.
  ParamSwap(const ParamSwapConfig& config, CachingAllocator& host, std::vector<size_t> shard_numel);
  ~ParamSwap();
  ParamSwap(const ParamSwap&) = delete;
  ParamSwap& operator=(const ParamSwap&) = delete;

  bool holds(int unit) const { return unit >= 0 && static_cast<size_t>(unit) < numel_.size() && numel_[idx(unit)] > 0; }

  // Starts reading unit u's shard into a free buffer, unless it is read or
  // held already; false where no buffer is free.
  bool start_read(int unit);
  // Unit u's shard in host memory (read now where no read was started). The
  // buffer stays the unit's until release(unit). Throws check_io's error
  // for a failed read, the buffer freed.
  std::span<const std::byte> acquire(int unit);
  void release(int unit);
  // acquire(unit)'s buffer, released when this goes: also when a copy out
  // of it throws.
  class Held {
   public:
    Held(ParamSwap& swap, int unit) : swap_(swap), unit_(unit), bytes_(swap.acquire(unit)) {}
    ~Held() { swap_.release(unit_); }
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    std::span<const std::byte> bytes() const { return bytes_; }

   private:
    ParamSwap& swap_;
    int unit_;
    std::span<const std::byte> bytes_;
  };
  // Waits for every read ahead and frees its buffer (their values may be
  // about to change: a step, a load).
  void drop_reads();

  // Elements [a, b) of unit u's current shard out to host memory, or in
  // from it (the current slot written in place: Note [parameter swap
  // regions]), through a pool buffer.
  void read(int unit, size_t a, size_t b, std::byte* out);
  void write(int unit, size_t a, size_t b, const std::byte* in);
  // Note [staged shard writes]: write() without the write. A loader storing
  // a shard piece by piece (a tensor's part, a run of padding) would
  // otherwise read and write the whole slot once a piece; staged, the slot
  // is read once, takes every piece in its buffer, and is written once:
  // by flush(), which every other call here makes first, so nothing reads
  // the file behind a staged piece. Callers flush where an operation that
  // wrote ends, so that a failed write is reported there.
  void write_piece(int unit, size_t a, size_t b, const std::byte* in);
  void flush();

  // The optimizer step's new values of unit u's elements [at, at + n), in
  // order; once the last element has come, the shard is written to its
  // other slot (Note [parameter swap regions]).
  void put_update(int unit, size_t at, const std::byte* values, size_t n);
  // The slots put_update wrote become current; or are forgotten.
  void commit();
  void discard();

  const std::string& path() const { return file_.path(); }
  uint64_t file_bytes() const { return file_.size(); }
  uint64_t host_buffer_bytes() const { return memory_.size_bytes(); }
  size_t buffer_bytes() const { return buffer_bytes_; }
  int buffer_count() const { return static_cast<int>(buffers_.size()); }

 private:
  enum class State { kFree, kReading, kHeld };
  struct Slot {
    State state = State::kFree;
    int unit = -1;
    std::optional<AioHandle> handle;
    uint64_t offset = 0;  // of the read in flight
  };
  static size_t idx(int unit) { return static_cast<size_t>(unit); }
  size_t bytes_of(int unit) const { return numel_[idx(unit)] * esize_; }
  uint64_t slot_offset(int unit, int region) const;
  std::byte* buffer(int b) const { return buffers_[static_cast<size_t>(b)]; }
  int free_buffer();
  int buffer_of(int unit) const;
  // Waits for buffer b's read; throws check_io's error where it failed,
  // the buffer freed.
  void finish_read(int b);
  void transfer(AioOp op, int unit, int region, std::byte* at);

  std::vector<size_t> numel_;
  size_t esize_;
  std::vector<uint64_t> offset_;  // of unit u's slot in a region; last: the region's size
  uint64_t region_bytes_ = 0;
  std::vector<uint8_t> current_;  // the region of unit u's current slot
  std::vector<uint8_t> pending_;  // put_update wrote the other slot
  std::shared_ptr<AioBackend> io_;
  SwapFile file_;
  size_t buffer_bytes_ = 0;
  Buffer memory_;
  std::vector<std::byte*> buffers_;
  std::vector<Slot> slots_;
  int update_buffer_ = -1;  // put_update's, while a unit's values come in
  int staged_ = -1;         // the unit write_piece gathers, its buffer held
};

}  // namespace zest
