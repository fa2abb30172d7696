// Internal (not installed): ZeRO-Offload's optimizer side. The first
// host_numel() elements of a rank's owned region of trainable units (the
// concatenation of their shards, ModelLayout::trainable_offset; frozen units
// have no optimizer side) keep their fp32 master weights
// and optimizer state in host memory; the rest, when offload_optimizer.ratio
// < 1, stay on the device with the engine.
//
// step() updates the host part in chunks of chunk_numel() elements, three
// stages in a pipeline over two staging slots:
//
//   d2h queue     [grad 0][grad 1]        [grad 2]        [grad 3] ...
//   host threads          [update 0]      [update 1]      [update 2] ...
//   h2d queue                     [params 0]      [params 1]     ...
//
// d2h copies chunk i+2's reduced gradients (compute dtype) into a host slot
// while the host optimizer updates chunk i+1 from its slot and the h2d queue
// copies chunk i's new compute-dtype parameters back. A slot's gradients are
// overwritten only after their update; its parameters only after their copy
// is done. The update is optimizer_step() on the host, the same per-element
// arithmetic the device runs, so an offloaded step has the bits of one that
// is not (fp32 compute: the master is the parameters, and it is copied back
// whole).
//
// With offload_optimizer device "nvme" (OffloadSwap, engine/detail/offload_swap.h)
// the master weights and state of the host part live in a swap file, and
// the update runs on the ring buffer that holds each chunk as it streams
// through: the same pipeline, the same arithmetic, the same bits. The
// parameters then always go back through the slots (the ring's buffer is
// reused as soon as the next chunk is computed). buffer() is null there:
// read() and write() copy ranges in and out.
//
// delayed_update (off by default): ZeRO-Offload's one-step delayed parameter
// update. step() copies this step's gradients to the host, copies back the
// parameters of the update started at the previous step, and starts the
// update of this step's gradients on a host thread of its own, to run while
// the caller's next forward and backward do: the forward of step t+1 sees
// the parameters updated through step t-1's gradients. The master weights
// and optimizer state are those of the undelayed run once settle() has
// waited for the update in flight (the engine settles before it reads or
// writes shards, so checkpoints hold every applied step); the gradients
// differ, being taken at parameters one step older.
#pragma once

#include <cstddef>
#include <array>
#include <exception>
#include <functional>
#include <memory>
#include <span>
#include <thread>
#include <vector>

#include "zest/core/dtype.h"
#include "zest/core/stream.h"
#include "zest/engine/layout.h"
#include "zest/engine/detail/offload_swap.h"
#include "zest/memory/caching_allocator.h"
#include "zest/memory/copy_queue.h"
#include "zest/optim/optimizer.h"

namespace zest {

// One trainable unit as the host pipeline sees it.
struct OffloadUnit {
  // Its shard's start in the owned region of the trainable units
  // (ModelLayout::trainable_offset), where the host part is indexed.
  size_t offset = 0;
  size_t host_numel = 0;            // its shard's first elements that live on the host
  const std::byte* grad = nullptr;  // device: the reduced gradient shard
  std::byte* params = nullptr;      // device: the compute-dtype parameter shard
  const std::vector<GroupRun>* runs = nullptr;  // shard-relative
  // Set instead of `params` (offload_param nvme: the shard is in a swap
  // file, engine/detail/param_swap.h): the new parameters [at, at + n) of the
  // shard, host memory, handed over in order as each chunk is updated.
  std::function<void(size_t at, const std::byte* values, size_t n)> put;
};

// Host wall-clock milliseconds of the pipeline's parts, summed over steps.
struct OffloadTimes {
  double d2h_ms = 0.0;     // the d2h queue copying
  double update_ms = 0.0;  // the host optimizer
  double h2d_ms = 0.0;     // the h2d queue copying
  double total_ms = 0.0;   // the whole pipeline, start to end
  // Device nvme (SwapRingTimes): the update thread blocked on the ring's
  // reads and writes, its time per chunk (the update with its copies'
  // hand-offs), and of that the part the drive was busy throughout.
  double read_wait_ms = 0.0;
  double write_wait_ms = 0.0;
  double chunk_ms = 0.0;
  double chunk_overlapped_ms = 0.0;
};

// What the offloaded part keeps: the parameters' (and gradients') compute
// dtype, and the master weights' and state's (fp32, or bf16: Note [bf16
// master weights and optimizer state] in optim/optimizer.h).
struct OffloadDtypes {
  DType compute = DType::kFloat32;
  DType master = DType::kFloat32;
  DType state = DType::kFloat32;
};

class OptimizerOffload {
 public:
  // `host` gives the host memory (pinned, for asynchronous CUDA copies);
  // `device` is the engine's.
  // `swap` set: the master weights and state in a swap file (device nvme;
  // not with `delayed`).
  OptimizerOffload(CachingAllocator& host, Device device, size_t host_numel, int state_buffers, OffloadDtypes dtypes,
                   bool delayed, const OffloadSwapConfig* swap = nullptr);
  ~OptimizerOffload();
  OptimizerOffload(const OptimizerOffload&) = delete;
  OptimizerOffload& operator=(const OptimizerOffload&) = delete;

  size_t host_numel() const { return host_numel_; }
  size_t chunk_numel() const { return chunk_; }
  // Buffer b of the host part: 0 the master weights, 1.. the state, of
  // the dtypes given at construction. Null where it is in a swap file.
  std::byte* buffer(int b) const;
  // The swap file's, where the host part lives in one (else null).
  OffloadSwap* swap() const { return swap_.get(); }
  // Elements [a, b) of buffer `buf` of the host part, out to or in from
  // host memory of its dtype, wherever it lives.
  void read(int buf, size_t a, size_t b, std::byte* out) const;
  void write(int buf, size_t a, size_t b, const std::byte* in);

  // Steps the host part of every unit (`units` in owned order), with the
  // weight decay of each parameter group. Reads the gradients after the work
  // queued on `compute` so far; `compute`'s later work sees the new
  // parameters. Returns with every copy done.
  void step(const Stream& compute, const OptimizerConfig& config, std::span<const OffloadUnit> units,
            std::span<const float> group_decay, StepScalars scalars);
  // The host part in a swap file back to the values before the last
  // step() (OffloadSwap::roll_back); the caller narrows the parameters back.
  void roll_back();
  // Delayed: waits for the update in flight and copies its parameters to
  // the device (`compute`'s later work sees them). A no-op otherwise, or
  // with no update in flight.
  void settle(const Stream& compute);

  OffloadTimes take_times();

 private:
  struct Piece {
    size_t begin;  // in the owned region
    size_t end;
    const OffloadUnit* unit;
  };
  // The pieces of units that chunk [a, b) covers, from units[*cursor] on.
  void pieces_of(size_t a, size_t b, std::span<const OffloadUnit> units, size_t& cursor,
                 std::vector<Piece>& out) const;
  void pipelined_step(const Stream& compute, const OptimizerConfig& config, std::span<const OffloadUnit> units,
                      std::span<const float> group_decay, StepScalars scalars);
  void delayed_step(const Stream& compute, const OptimizerConfig& config, std::span<const OffloadUnit> units,
                    std::span<const float> group_decay, StepScalars scalars);
  // Where the master and state of a run of the host part are: buffer b's
  // element `first` at at[b].
  struct HostSpan {
    std::array<std::byte*, 3> at{};
    size_t first = 0;
  };
  // Updates `pieces` from gradients at `grads` (in the host part's
  // indexing, minus `base`), new parameters into `params` the same way
  // (null: master_is_params() in the pipeline, where the master is copied),
  // the master and state at `host`.
  void update(const std::vector<Piece>& pieces, const OptimizerConfig& config, std::span<const float> group_decay,
              StepScalars scalars, const std::byte* grads, std::byte* params, size_t base, const HostSpan& host);
  HostSpan in_memory() const;
  // Waits for the delayed update's thread; rethrows its error.
  void join_update();
  // The master weights are the parameters' dtype (fp32 compute, bf16 master
  // weights): the pipeline copies them back as they are, with no slot.
  bool master_is_params() const { return dtypes_.master == dtypes_.compute; }
  // The parameters go to the device from the master itself (no slot).
  bool params_from_master() const { return master_is_params() && !swap_; }

  size_t host_numel_;
  int state_buffers_;
  OffloadDtypes dtypes_;
  size_t chunk_;
  Buffer master_;
  Buffer state_[2];
  std::unique_ptr<OffloadSwap> swap_;  // device nvme
  // Two slots, each a chunk of gradients and (unless the master is the
  // parameters) of parameters.
  Buffer grad_slot_[2];
  Buffer param_slot_[2];
  // delayed_update: the whole host part's gradients, and its parameters as
  // the update in flight leaves them; the units it updates.
  bool delayed_;
  Buffer grads_all_;
  Buffer params_all_;
  std::vector<Piece> delayed_pieces_;
  std::vector<OffloadUnit> delayed_units_;
  std::thread update_thread_;
  std::exception_ptr update_error_;
  double update_thread_ms_ = 0.0;
  bool in_flight_ = false;
  OffloadTimes times_;
  // Declared last: destroyed first, so no copy is left reading a slot.
  CopyQueue d2h_;
  CopyQueue h2d_;
};

// The elements of the owned region kept on the host for offload_optimizer
// `ratio` (in [0, 1]) of `owned` elements: all at 1, else a multiple of
// kParamAlign.
size_t offloaded_numel(size_t owned, double ratio);

}  // namespace zest
