// Internal: the engine's state and the work behind its interface (not
// installed): Engine::Impl, of which Engine is the handle, and each unit's
// buffers and bookkeeping.
#pragma once

#include <chrono>

#include <memory>
#include <optional>
#include <vector>

#include "zest/core/stream.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/optimizer_offload.h"
#include "zest/engine/detail/param_swap.h"
#include "zest/engine/detail/shard_groups.h"
#include "zest/memory/caching_allocator.h"
#include "zest/optim/lamb.h"

namespace zest {

struct EngineUnitState {
  using Grads = Engine::GradState;

  // Full parameters in the compute dtype: always at stages 0-2 and for
  // persistent units at stage 3 ("resident"); at stage 3 otherwise only
  // while gathered or prefetched.
  Buffer params_full;
  // Stage 3, non-resident units: the owned shard of the parameters.
  Buffer params_shard;
  // hpZ (Note [hpZ] in config.h): this rank's part of the unit's parameters
  // sharded over its hpZ group (padded / H elements), from the first gather
  // since the last optimizer step; empty otherwise.
  Buffer params_secondary;
  // What backward writes: persistent at stages 0-1, per micro-step at 2-3.
  Buffer grads_full;
  // The reduced gradients of the owned shard, accumulated over micro-steps.
  // Always at stages 2-3; at stages 0-1 only when accumulating. Under
  // Impl::local_accumulation instead the sum of the micro-steps' unreduced
  // gradients, full size: it and grads_full trade places each micro-step.
  Buffer grad_acc;
  // The shard's first host_numel elements keep their master weights and
  // optimizer state in host memory (Impl::offload); the rest on the device.
  size_t host_numel = 0;
  // ModelLayout::shard_runs of this rank's shard: fixed by finalize(), and
  // read every optimizer step.
  std::vector<GroupRun> runs;

  // Note [a master widened when first read] (engine_load.cpp): the master
  // shard is stale, and its values are the owned compute-dtype parameters
  // widened; shard_pieces(u, 0) and the optimizer step widen it first.
  bool master_deferred = false;
  // Between begin_shard_load and finish_shard_load / abandon_shard_load:
  // the loader was given the owned parameters to read into directly.
  bool loading_in_place = false;

  bool resident = true;
  int gathered = 0;     // live UnitHandles
  Pass last_pass = Pass::kTraining;  // of the latest gather(): kNone keeps nothing
  Grads grads = Grads::kIdle;
  std::optional<Event> ready;  // the unit's last gather is complete
};

// Adds the time from its construction to its end to `into` (ms).
class PhaseTimer {
 public:
  explicit PhaseTimer(double& into) : into_(into), start_(std::chrono::steady_clock::now()) {}
  ~PhaseTimer() {
    into_ += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_).count();
  }
  PhaseTimer(const PhaseTimer&) = delete;
  PhaseTimer& operator=(const PhaseTimer&) = delete;

 private:
  double& into_;
  std::chrono::steady_clock::time_point start_;
};

// Stage 3's gather order of one kind of pass (Note [stage-3 reuse distance]
// and Note [a gather order per kind of pass], engine_gather.cpp): recorded
// over its first pass (persistent units too), then replayed. `ends` are
// where a training pass's micro-steps end (positions in `units`,
// ascending); an inference pass is a single forward.
struct RecordedOrder {
  std::vector<int> units;
  std::vector<size_t> ends;
  bool recording = true;
  bool valid = true;  // false: a pass strayed from it (or, recording, outgrew the limit)
  bool warned = false;
  size_t pos = 0;

  // A pass ends: a recording is complete, an order strayed from is recorded
  // again over the next pass, and the next pass starts from the beginning.
  void end_pass() {
    if (!valid) {
      units.clear();
      ends.clear();
      recording = true;
      valid = true;
    } else if (recording) {
      recording = false;
    }
    pos = 0;
  }
};

// LAMB's pieces of this rank's owned shards (optim/lamb.h), fixed by the
// layout and built at the first step: every trainable parameter numbered in
// unit order (the same numbers on every rank), the owned part of each cut
// into pieces relative to the start of its run's ShardBuffers.
struct LambPlan {
  struct Run {
    int unit = 0;
    size_t begin = 0;  // shard-relative, from the first device element
    size_t numel = 0;
    int group = 0;
    size_t first_piece = 0;
    size_t pieces = 0;
  };
  std::vector<LambPiece> pieces;
  std::vector<Run> runs;
  size_t params = 0;
  Buffer device_pieces;  // a copy of `pieces` where the kernels read them (unused on a host stream)
};

class Engine::Impl {
 public:
  using UnitState = EngineUnitState;

  // Engine's constructors: the config checked and its batch resolved at
  // comm's size; host_allocator given, or nullptr (offloading engines make
  // their own).
  Impl(Engine& self, EngineConfig config, Communicator& comm, CachingAllocator& allocator,
       CachingAllocator* host_allocator, Stream stream);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  // --- Engine's interface (engine.h says what each does) ---
  void add_param_group(const std::string& name, float weight_decay);
  int add_unit(const std::string& name, std::vector<ParamSpec> params);
  void set_model_parallel(const ModelParallel& mp);
  const ModelParallel& model_parallel() const;
  void finalize(const Initializer& init, InitFrom from = InitFrom::kRank0);
  UnitHandle gather(int unit, Pass pass = Pass::kTraining);
  void end_forward();
  GradHandle grads(int unit);
  void no_grads(int unit);
  double loss_scale() const;
  StepResult step();
  void set_lr(double lr);
  void clear_lr();
  void set_lr_schedule(LrSchedule schedule);
  double next_lr() const;
  void set_tokens_per_micro_batch(int64_t tokens);
  const EngineConfig& config() const { return config_; }
  int stage() const { return config_.zero.stage; }
  DType compute_dtype() const { return compute_dtype_; }
  DType grad_accum_dtype() const { return grad_accum_dtype_; }
  DType master_dtype() const { return master_dtype_; }
  DType state_dtype() const { return state_dtype_; }
  Stream stream() const { return stream_; }
  Communicator& shard_comm() const;
  Communicator* replica_comm() const;
  Communicator* hpz_comm() const;
  std::vector<float> unit_master(int unit);
  std::vector<float> param_master(const std::string& name);
  MemoryReport memory_report() const;
  bool persistent(int unit) const;
  Progress progress() const;
  int micro_steps_pending() const;
  int shard_buffers() const { return 1 + config_.optimizer.state_buffers(); }
  std::vector<float> read_shard(int unit, int buffer);
  void write_shard(int unit, int buffer, std::span<const float> values);
  void restore(const Progress& progress);
  ShardLoad begin_shard_load(int unit, std::optional<DType> every_value = std::nullopt);
  void load_shard(int unit, size_t at, const void* values, DType dtype, size_t n);
  void load_shard(int unit, size_t at, std::span<const float> values) { load_shard(unit, at, values.data(), DType::kFloat32, values.size()); }
  void abandon_shard_load(int unit);
  void finish_shard_load(const Progress& progress);
  void widen_deferred_masters();
  std::vector<int64_t> all_gather_scalars(std::span<const int64_t> mine);
  int partition() const;

  // --- the work behind it ---
  void check_finalized(const char* what) const;
  // Throws unless the communicator and allocator still exist.
  void check_borrowed(const char* what) const;
  UnitState& state(int unit);
  detail::UntypedSpan<const void> param_view(int unit, const std::string& name, DType dtype) const;
  detail::UntypedSpan<void> grad_view(int unit, const std::string& name, DType dtype) const;
  const void* unit_params(int unit) const;
  void* unit_grads(int unit) const;
  // The checks both views share; `what` ("parameter" or "gradient") names
  // the view in the dtype message.
  const ParamLayout& view_param(int unit, const std::string& name, DType dtype, const char* what) const;
  void release(int unit);
  // Unit u's gradients for this micro-step: zeroed (allocated at first),
  // open for writing until grads_done.
  void open_grads(int unit);
  void grads_done(int unit);
  // Unit u's shard of buffer b (0: master weights, 1..: optimizer state)
  // in at most two pieces, [begin, end) of the shard each: its first
  // elements in host memory (offload), the rest on the device.
  // Elements of `dtype` (the buffer's: master_dtype_ or state_dtype_).
  struct ShardPiece {
    std::byte* data = nullptr;
    DType dtype = DType::kFloat32;
    size_t begin = 0;
    size_t end = 0;
    bool host = false;
    // Where shard element i (in [begin, end)) lies.
    std::byte* at(size_t i) const { return data + (i - begin) * elem_size(dtype); }
  };
  // Buffer 0 widens a deferred master first (Note [a master widened when
  // first read]); stored_shard_pieces does not.
  std::array<ShardPiece, 2> shard_pieces(int unit, int buffer);
  std::array<ShardPiece, 2> stored_shard_pieces(int unit, int buffer);
  // The deferred master of unit u widened from its parameters, now.
  void widen_deferred_master(int unit);
  // The values of shard elements [a, b) of piece p as fp32 to `dst`, or
  // fp32 values from `src` narrowed into them; dst_host / src_host say
  // whether dst / src is host memory or memory of the engine's device. Ordered
  // on the engine's stream; the caller synchronizes before reading dst.
  void piece_to_fp32(const ShardPiece& p, size_t a, size_t b, float* dst, bool dst_host);
  void piece_from_fp32(const ShardPiece& p, size_t a, size_t b, const float* src, bool src_host);
  // Note [host pieces in a swap file]: with offload_optimizer device nvme a
  // shard's host piece has no address (data null). Its readers and writers
  // take the elements [a, b) they touch as a piece in `staging` (read from
  // the file when `read`); unstage writes such a piece back. Any other
  // piece is its own staged piece, and unstage does nothing.
  ShardPiece staged(int unit, int buffer, const ShardPiece& p, size_t a, size_t b, std::vector<std::byte>& staging,
                    bool read);
  void unstage(int unit, int buffer, const ShardPiece& stored, const ShardPiece& staged);
  // Unit u's owned compute-dtype parameters narrowed from its master (the
  // parts where the master is not the parameters themselves), as restore()
  // rebuilds them.
  void params_from_master(int unit);
  // After a failed offloaded step (Note [a failed NVMe step], in
  // engine_step.cpp): params_from_master for every unit with a host part.
  void undo_offloaded_params();
  // Whether the master weights are the compute-dtype parameters themselves
  // (fp32 compute, or bf16 master weights with bf16 compute) rather than a
  // copy of their own.
  bool master_is_params() const { return master_dtype_ == compute_dtype_; }
  // restore()'s first half: the step counts, loss scaler and learning rate.
  void restore_progress(const Progress& progress);
  // Whether unit u's master shard and compute-dtype shard are both in host
  // memory, where the host writes them directly (engine_load.cpp).
  bool shard_in_host_memory(int unit);
  // Reads (read non-empty) or writes a frozen unit's owned values as fp32.
  void frozen_shard(int unit, std::span<float> read, std::span<const float> write);
  // A frozen unit's owned compute-dtype values where a kernel can read them:
  // in place, or with offload_param copied from the host into `temp`.
  const std::byte* readable_params(int unit, Buffer& temp);
  // Whether this rank's shard of unit u's parameters is in host memory
  // (offload_param, a unit gathered on demand).
  bool shard_on_host(int unit) const;
  // Narrows n fp32 values at `src` (device memory) into this rank's shard of
  // unit u's parameters from shard element `at`; a shard in host memory gets
  // them through `scratch` (n compute-dtype elements on the device; unused
  // otherwise), as no kernel writes host memory.
  void narrow_into_shard(int unit, const float* src, size_t at, size_t n, std::byte* scratch);
  // offload_optimizer.delayed_update: waits for the update in flight and
  // brings its parameters in, before shards are read or written.
  void settle_offload();
  // This rank's part of a full unit-sized buffer (parameters or gradients).
  std::byte* owned_part(const Buffer& full, int unit) const;
  // Where this rank's shard of unit u's compute-dtype parameters lives: in
  // the full parameters when they are resident, else the shard buffer.
  std::byte* owned_params(int unit) const;
  // zero_optimization.offload_param at stage 3: the shards of the units
  // gathered on demand live in the host allocator or, device nvme past
  // max_in_cpu, in a swap file (shard_in_swap).
  bool offloads_params() const {
    return config_.offload_param.device != OffloadDevice::kNone && config_.zero.stage == 3;
  }
  // offload_param nvme: unit u's shard is in the parameter swap file
  // (engine/detail/param_swap.h), with no address of its own.
  bool shard_in_swap(int unit) const;
  // finalize(): the parameter swap file, where offload_param nvme puts shards.
  void make_param_swap();
  // engine_gather.cpp
  void materialize(int unit);
  void drop(int unit);
  // Drops every gathered copy no handle holds (prefetches, units kept for
  // their reuse).
  void drop_unheld();
  bool reused_soon(int unit) const;
  size_t pass_part_end() const;
  void prefetch_after(size_t pos);
  void read_ahead(size_t pos, size_t end);
  void enter_pass(Pass pass);
  void end_inference_pass();
  void follow_trace(int unit);
  // engine_grads.cpp
  void flush_reductions();
  void reduce_across_replicas();
  // shard_comm() and the communicator for its scalars, unchecked.
  Communicator& shard_group() const;
  Communicator& shard_control() const;
  // engine_step.cpp: step()'s phases (Note [the step's phases]).
  struct StepInFlight;
  void begin_boundary();
  void decide_update(StepInFlight& step);
  void apply_update(StepInFlight& step);
  void update_device_shards(StepInFlight& step);
  void update_host_shards(const StepInFlight& step);
  // Note [an NVMe step agreed across ranks]: the host part, then every
  // rank's outcome agreed; throws on every rank where one failed.
  void update_host_shards_agreed(const StepInFlight& step, bool host_part);
  StepResult finish_step(StepResult result, const StepInFlight& step);
  void end_micro_step();
  const void* reduced_grad(int unit) const;
  DType reduced_grad_dtype(int unit) const;
  int64_t* global_sum_of_squares(float scale, Buffer& sums);
  // finalize() on a tp rank other than 0: Impl::tp_duplicates.
  void find_tp_duplicates();
  ShardBuffers device_shard(int unit);
  // engine_lamb.cpp: the LAMB optimizer on the owned shards; `workspace`
  // (new) must outlive the kernels and reductions it queues.
  void lamb_step(StepScalars scalars, Buffer& workspace);
  // `frozen_too`: also the frozen units (after write_shard changed them).
  void gather_updated_params(bool frozen_too = false);
  // A boundary's end: the throughput into `result`, and the progress line.
  void report_progress(StepResult& result, double lr);
  // The work of an optimizer step starts (its first gather() or grads()).
  void start_step_clock();

  // --- state ---
  Engine& self_;  // the handle, which UnitHandle and GradHandle point at
  EngineConfig config_;
  Communicator& comm_;
  CachingAllocator& allocator_;
  CachingAllocator* host_allocator_ = nullptr;  // offload: given or own_host_allocator_
  std::unique_ptr<CachingAllocator> own_host_allocator_;
  Stream stream_;
  DType compute_dtype_;
  DType grad_accum_dtype_;
  DType master_dtype_;  // fp32, or bf16 (EngineConfig::bf16_master_weights_and_grads)
  DType state_dtype_;   // fp32, or bf16 (EngineConfig::bf16_optimizer_states)
  std::weak_ptr<const void> comm_alive_;
  std::weak_ptr<const void> allocator_alive_;
  std::weak_ptr<const void> host_allocator_alive_;  // expired: none borrowed
  Lifetime lifetime_;  // watched by the handles

  std::vector<ParamGroupSpec> groups_;
  std::vector<UnitSpec> specs_;
  std::unique_ptr<ModelLayout> layout_;
  std::unique_ptr<Communicator> control_;  // scalars: digests, norms, broadcasts
  // MiCS (Note [MiCS] in config.h): the shard and replica groups, and a
  // split of the shard group for its scalars (norms, master gathers). All
  // null under flat sharding, where the engine's communicator and `control`
  // serve instead (Engine::shard_group, shard_control). With hpZ, its group.
  ShardGroups mics_;
  std::unique_ptr<Communicator> mics_control_;
  // set_model_parallel(): the model-parallel group and coordinates; and,
  // on tp ranks other than 0, the ranges of each unit's shard (relative to
  // its start) holding tp_replicated parameters, which the norm skips
  // there; `replicated_only`: the whole shard is such (or padding).
  ModelParallel mp_;
  std::vector<std::vector<std::pair<size_t, size_t>>> tp_duplicates_;
  std::vector<char> replicated_only_;
  std::optional<OwnedStream> comm_stream_;
  std::optional<Event> handoff_;  // compute -> comm ordering
  std::vector<UnitState> units_;

  // The owned region's elements [0, host_numel) are offloaded; the device
  // holds [host_numel, owned()) in these.
  Buffer master_;    // fp32 (16-bit compute only; fp32: the parameters)
  Buffer state_[2];  // optimizer state
  size_t host_numel_ = 0;
  std::unique_ptr<OptimizerOffload> offload_;  // with host_numel > 0
  // offload_param nvme: the shards past max_in_cpu (engine/detail/param_swap.h).
  std::unique_ptr<ParamSwap> param_swap_;
  LossScaler scaler_;

  int part_ = 0;  // this rank's shard index (0 at stage 0)
  int micro_ = 0; // micro-steps done in this accumulation
  // ZeroConfig::reduce_at_accumulation_boundary with more than one
  // micro-step: gradients are added locally and reduced at the last.
  bool local_accumulation_ = false;
  int64_t applied_ = 0;
  int64_t skipped_ = 0;
  std::optional<double> lr_override_;  // set_lr()
  LrSchedule lr_schedule_;             // set_lr_schedule()

  // Units whose gradients are done and not yet reduced, and their size.
  std::vector<int> pending_;
  size_t pending_numel_ = 0;

  // Stage 3 prefetch and reuse: a recorded order per kind of pass, the one
  // of the latest gather, and whether an inference pass has begun and not
  // ended (Note [a gather order per kind of pass], engine_gather.cpp).
  RecordedOrder orders_[2];
  Pass pass_ = Pass::kTraining;
  bool inference_open_ = false;
  size_t live_numel_ = 0;

  std::unique_ptr<LambPlan> lamb_;  // the first LAMB step builds it

  StepTimes times_;  // since the last boundary (StepResult::times)
  // Throughput: set_tokens_per_micro_batch(), and when the current optimizer
  // step's work began (unset until its first gather() or grads()).
  int64_t tokens_per_micro_ = 0;
  std::optional<std::chrono::steady_clock::time_point> step_start_;

  Stream comm_queue() const { return comm_stream_->get(); }  // where reductions and gathers run
  RecordedOrder& order() { return orders_[static_cast<int>(pass_)]; }
  const RecordedOrder& order() const { return orders_[static_cast<int>(pass_)]; }
};

}  // namespace zest
