// The ZeRO engine: holds a model's parameters, gradients, fp32 master
// weights and optimizer state, sharded across the data-parallel ranks of a
// communicator, around a training loop whose forward and backward are the
// user's own.
//
//   // zest-example: prelude=training
//   zest::Engine engine(config, comm, allocator, stream);
//   engine.add_param_group("no_decay", 0.0f);
//   int fc1 = engine.add_unit("fc1", {{"fc1.w", {256, 128}}, {"fc1.b", {256}, "no_decay"}});
//   engine.finalize(my_initializer);                 // or values broadcast from rank 0
//   for (;;) {
//     // forward with engine.gather(fc1) views, loss x engine.loss_scale();
//     // backward into engine.grads(fc1) views, done() per unit
//     zest::StepResult r = engine.step();
//   }
//
// Stages (DeepSpeed's zero_optimization.stage):
//   0  every rank holds everything; gradients are all-reduced
//   1  optimizer state and fp32 master weights are sharded; gradients are
//      reduce-scattered, the updated parameters all-gathered
//   2  as 1, and only the owned shard of the gradients is kept between
//      micro-steps
//   3  as 2, and parameters too are sharded: gather() all-gathers a unit
//      (prefetching the next one in the order recorded on the first
//      iteration, one order for training and one for inference) and the
//      handle's end releases it, unless the recorded order uses it again
//      within zero.stage3_max_reuse_distance parameters in this micro-step
//      (Notes [stage-3 reuse distance] and [a gather order per kind of
//      pass], engine_gather.cpp)
// At stage 3, zero.mics_shard_size (MiCS, FSDP2's HSDP) shards the model
// states within groups of ranks and replicates them across the groups, and
// zero.zero_hpz_partition_size (ZeRO++'s hpZ) keeps a secondary copy of the
// parameters within groups for the gathers after a step's first: Notes
// [MiCS] and [hpZ] in config.h, docs/MICS.md.
//
// Gradients are averaged over ranks each micro-step (in the compute dtype)
// and accumulated in grad_accum_dtype(); step() divides by the accumulation steps and the loss scale,
// clips by the global norm, and steps the owned shards. Every operation on
// the gradients is elementwise, and the norm is an exact sum of per-chunk
// sums (optim/grad_norm.h), so all stages give bit-identical parameters on
// the in-process backend.
//
// With zero.reduce_at_accumulation_boundary (stages 0-1; off by default) the
// ranks instead add their micro-steps' gradients locally and reduce the sum
// once, at the last micro-step, as DDP's no_sync() and DeepSpeed's stages
// 0-1 do: accumulation-steps times fewer reductions and bytes, one more
// full-size gradient buffer, and results that are NOT bit-identical to
// stages 2-3 (or to the option off): averaging the sums and summing the
// averages round differently, by a few ulps of the gradients (config.h,
// Note [reduce at the accumulation boundary]).
//
// Frozen parameters (ParamSpec::trainable = false, in units of their own)
// are held in the compute dtype and sharded at stage 3 like the others, with
// no gradient, master weights or optimizer state; their values never change
// and are saved with checkpoints. With offload_optimizer the host part is
// the trainable units' shards only; with offload_param a frozen unit's shard
// is in host memory like the others.
//
// Memory is allocated from the given allocator under the categories of
// memory_category.h, so allocator.stats() reports it in the ZeRO paper's
// terms: see memory_report().
//
// Offload (zero_optimization.offload_optimizer, device "cpu", stages 1-3,
// as DeepSpeed's ZeRO-Offload): the fp32 master weights and optimizer state
// of the owned shard live in host memory, from a second, host allocator
// (given, or the engine's own: pinned with pin_memory on CUDA). step()
// copies the reduced gradients to the host, updates there with the host
// optimizer (OptimizerConfig::host_threads threads), and copies the new
// compute-dtype parameters back, in chunks whose copies overlap the updates
// (a copy stream and events on CUDA, a copy thread on the host backend; see
// memory/copy_queue.h). offload_optimizer.ratio < 1 keeps the rest of the
// state on the device, updated there. The arithmetic is the device's, so an
// offloaded run has the bits of one that is not.
//
// offload_optimizer.delayed_update (off by default) is ZeRO-Offload's
// one-step delayed parameter update: step() starts the host update of its
// gradients on a thread of its own and returns, the update running while the
// next forward and backward do; its parameters reach the device at the next
// step() (or a skipped one). So the forward of step t+1 sees the parameters
// updated through step t-1's gradients, not step t's: training takes its
// gradients at parameters one step old (a part kept on the device by ratio <
// 1 is not delayed). read_shard, write_shard, unit_master, param_master,
// restore and so checkpoints first wait for the update in flight: what they
// see includes every applied step.
//
// offload_optimizer device "nvme" (ZeRO-Infinity's optimizer tier): the
// same, the offloaded master weights and optimizer state in a swap file per
// rank under nvme_path (scratch: a unique name, removed with the engine)
// instead of host memory. Each step streams them through a ring of
// buffer_count aligned host buffers: the next chunks are read while the
// host optimizer updates this one and the previous one is written back
// (engine/detail/offload_swap.h). The bits are those of CPU offload and of the
// device run. A failed transfer throws an Error naming the file and the
// operation, and leaves the rank as before the step: master weights, state
// and parameters (Note [a failed NVMe step], engine_step.cpp). Not with
// delayed_update.
//
// offload_param (device "cpu", stage 3, with offload_optimizer "cpu" or
// "nvme" at ratio 1): the parameter shards of the units gathered on demand live in the
// host allocator too. A gather copies this rank's shard into its slot of the
// unit's full buffer on the device and all-gathers in place; the host update
// writes the new shard where it lives. The device then holds parameters only
// while units are gathered (and the persistent units), as ZeRO-Infinity's
// CPU offload does; the bits are those of a run without it.
//
// offload_param device "nvme" (ZeRO-Infinity's parameter tier; stage 3,
// with offload_optimizer "nvme" at ratio 1): as "cpu" for the trainable
// shards that add up to at most max_in_cpu elements; the others, and the
// frozen ones, live in a second swap file per rank under
// offload_param.nvme_path (engine/detail/param_swap.h). A gather reads the shard
// into one of buffer_count host buffers (of the largest such shard; a shard
// over buffer_size elements is refused by name), and the prefetcher reads
// the units next in the recorded order ahead into the free ones; the step's
// host update writes each new shard back beside the current one, current
// once the step succeeded on every rank, so a failed step leaves the
// parameters as its master weights are rolled back to. The bits are those
// of offload_param "cpu" and of no offload. A read that fails at a gather
// throws on its rank (naming the file and the operation) with nothing
// gathered; the other ranks then wait in that gather's all-gather until the
// communicator's timeout, as for any rank that stops between collectives.
//
//   // zest-example: prelude=training
//   // A "device" of 64 MiB, as the host backend's tests model one.
//   zest::CachingAllocator small(zest::make_limited_allocator(zest::make_host_allocator(), 64 << 20));
//   zest::CachingAllocator host_memory(zest::make_host_allocator());
//   config.zero.stage = 2;
//   config.offload_optimizer.device = zest::OffloadDevice::kCpu;
//   zest::Engine engine(config, comm, small, host_memory, stream);
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/core/lifetime.h"
#include "zest/core/stream.h"
#include "zest/config/config.h"
#include "zest/engine/layout.h"
#include "zest/engine/step_result.h"
#include "zest/engine/unit_handle.h"
#include "zest/memory/caching_allocator.h"
#include "zest/mesh/model_parallel.h"
#include "zest/optim/loss_scaler.h"

namespace zest {

// Fills a parameter's initial values (fp32, host memory, numel elements).
using Initializer = std::function<void(const ParamLayout& param, std::span<float> values)>;

enum class InitFrom {
  kRank0,      // rank 0's initializer values are broadcast to every rank
  kEveryRank,  // every rank runs the initializer (it must be deterministic)
  kZeros       // no initializer runs: zeros, for weights a load overwrites
               // (no host copy of a unit, nothing broadcast)
};

// What a gather is for, which picks the stage-3 gather order it follows
// (Note [a gather order per kind of pass], engine_gather.cpp).
enum class Pass {
  kTraining,   // a forward whose backward follows, and that backward
  kInference,  // a forward alone (evaluation, generation): no gradients
  kNone,       // neither (reading a weight between steps, as DeepSpeed's
               // GatheredParameters does): follows no order
};

// Bytes by category, now and at their peak, from the allocator's tags.
struct MemoryReport {
  struct Entry {
    int64_t current = 0;
    int64_t peak = 0;
  };
  std::array<Entry, kNumMemoryCategories> by_category{};
  // Of kParameters' current bytes, those of frozen units (they have nothing
  // in the other categories).
  int64_t frozen_parameters = 0;
  int64_t reserved = 0;   // segments the allocator holds
  int64_t allocated = 0;  // blocks in use (rounded sizes)
  // The highest reserved and allocated since the allocator's construction
  // (or its reset_peak_stats()): what the engine's allocator took from the
  // system at most, the part of a process's peak memory that is ZEST's.
  int64_t peak_reserved = 0;
  int64_t peak_allocated = 0;

  const Entry& operator[](MemoryCategory c) const { return by_category[category_index(c)]; }
  // current bytes of parameters, gradients, master weights and optimizer state
  int64_t model_states() const;

  // The same from the host allocator (offload_optimizer, offload_param):
  // the offloaded master weights and optimizer state, the offloaded
  // parameter shards, and the copies' staging (comm_buffers). All zero
  // without offload.
  std::array<Entry, kNumMemoryCategories> host_by_category{};
  int64_t host_reserved = 0;
  int64_t host_allocated = 0;
  int64_t host_peak_reserved = 0;
  const Entry& host(MemoryCategory c) const { return host_by_category[category_index(c)]; }
  int64_t host_model_states() const;

  // The NVMe tier (offload_optimizer device nvme): the bytes of this rank's
  // swap file by category, kMasterWeights its master fields and
  // kOptimizerState the rest (state buffers and the records' alignment),
  // both regions (engine/detail/offload_swap.h), and with offload_param nvme
  // kParameters the parameter swap file (engine/detail/param_swap.h); the files'
  // sizes are fixed, so current and peak are equal. All zero without them.
  // host_swap_buffers: of the host allocator's comm_buffers, the swap
  // ring's block (Note [swap ring in the host allocator] in
  // engine/detail/offload_swap.h) and the parameter swap pool's.
  std::array<Entry, kNumMemoryCategories> nvme_by_category{};
  int64_t host_swap_buffers = 0;
  const Entry& nvme(MemoryCategory c) const { return nvme_by_category[category_index(c)]; }
  int64_t nvme_bytes() const;

  // Note [what a process's peak RSS holds]. The process's resident memory
  // when the report was taken (core/process_memory.h; -1 where unknown),
  // and of its peak the part that is this engine's: what its allocators
  // took from host memory at most (the host allocator's peak reserved, and
  // the device allocator's when the device is the host). The rest, which
  // no allocator of ZEST's holds, is libtorch's (activations, its own
  // caching allocator), the runtime's (code, libraries, thread stacks) and
  // the program's; unaccounted_peak() names it for a process of one rank.
  int64_t process_rss = -1;
  int64_t process_peak_rss = -1;
  int64_t engine_host_peak = 0;
  // process_peak_rss - engine_host_peak; -1 where the peak is unknown. With
  // several in-process ranks subtract every rank's engine_host_peak.
  int64_t unaccounted_peak() const { return process_peak_rss < 0 ? -1 : process_peak_rss - engine_host_peak; }
};

class Engine {
 public:
  // `comm` is the data-parallel group; the engine keeps a reference (and
  // splits off a communicator of its own for scalars, so comm's counters
  // count only parameters and gradients; with MiCS or hpZ, the groups it
  // splits count theirs: shard_comm(), replica_comm(), hpz_comm()). `stream` is the stream of the
  // user's compute; it and the allocator must be on comm's device.
  //
  // The config's batch triple is resolved here at comm.size() ranks, by
  // DeepSpeed's rules (EngineConfig::resolve_batch): config() then holds all
  // three, and step() applies the optimizer every accumulation_steps()
  // calls. An inconsistent triple throws. Rank 0 logs, once, the config
  // keys ignored, the "auto" values filled and the batch arithmetic.
  //
  // The engine borrows `comm` and `allocator`, as a std::span borrows its
  // elements: declare them before the engine so that they outlive it. Using
  // the engine after either was destroyed throws an Error saying which;
  // destroying it then is safe (its memory stays in the segments the
  // allocator leaked, with a warning, at its destruction). UnitHandle and
  // GradHandle borrow the engine the same way.
  Engine(EngineConfig config, Communicator& comm, CachingAllocator& allocator, Stream stream);
  // With offload_optimizer, the offloaded state comes from `host_allocator`
  // (host memory: make_host_allocator, or make_cuda_pinned_allocator for
  // asynchronous CUDA copies), borrowed like `allocator`. Without it (the
  // constructor above) an offloading engine makes its own: pinned when
  // offload_optimizer.pin_memory (or offload_param.pin_memory) is set and
  // the device is a GPU.
  Engine(EngineConfig config, Communicator& comm, CachingAllocator& allocator, CachingAllocator& host_allocator,
         Stream stream);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // --- registration (identical on every rank), then finalize ---

  // A parameter group with its own weight decay. "default" exists and takes
  // the optimizer's weight_decay.
  void add_param_group(const std::string& name, float weight_decay);
  // Returns the unit's index (0, 1, ... in registration order).
  int add_unit(const std::string& name, std::vector<ParamSpec> params);
  // Tensor and pipeline parallelism around the data-parallel `comm` (a
  // DeviceMesh's dp(), mesh/device_mesh.h): `mp` names this rank's tp and pp
  // coordinates and the model-parallel group (tp x pp ranks holding one copy
  // of the model between them). Before finalize. The engine then shards
  // only over comm, as before, and makes global what must be: the square of
  // the gradient norm, which also finds an fp16 overflow or a NaN, is summed
  // over the model-parallel group too (exactly, in integers: the clipped
  // update and the norm have the bits of one rank holding the whole model
  // wherever the chunks of 256 elements the norm is summed in coincide,
  // optim/grad_norm.h), counting a ParamSpec::tp_replicated parameter on tp
  // rank 0 only. ZeRO stages 2 and 3 work with pp > 1 (DeepSpeed's
  // PipelineEngine refuses them): each micro-batch's backward is a
  // micro-step, reduced as under gradient accumulation. Refused, by name:
  // LAMB with tp > 1 (its per-parameter trust ratios would see slices),
  // and a group whose size is not tp x pp; at finalize(), a configuration's
  // AutoTP size other than tp. Checkpoints keep a part per tp x pp rank
  // (checkpoint.h); weight exports join the parts into the whole model's
  // file (checkpoint/whole_model.h); imports refuse a model-parallel
  // engine. The norm's all-reduce makes step() collective over the
  // model-parallel group: every tp rank and every pipeline stage calls it
  // for the same micro-steps (a schedule's stages step together at the end
  // of the batch).
  void set_model_parallel(const ModelParallel& mp);
  const ModelParallel& model_parallel() const;
  // Lays the model out, checks across ranks that every rank registered the
  // same model, allocates, and sets the initial values. Collective.
  void finalize(const Initializer& init, InitFrom from = InitFrom::kRank0);

  // --- forward and backward ---

  // At stage 3 `pass` chooses the recorded order the gather follows, as
  // DeepSpeed keeps a parameter coordinator for training and one for
  // evaluation: an evaluation pass given Pass::kInference neither disturbs
  // training's prefetching nor leaves a unit gathered after it, and a
  // gather outside forward and backward (Pass::kNone) follows neither.
  UnitHandle gather(int unit, Pass pass = Pass::kTraining);
  // The end of a forward pass with no backward (Pass::kInference), as
  // DeepSpeed's end-of-forward hook ends one run with grad off: the next
  // inference gather starts a new pass of the recorded order, and the units
  // gathered for this one that no handle holds are released. Without it an
  // inference pass ends at the next training gather. Nothing to do at
  // stages 0-2.
  void end_forward();
  // The unit must be gathered (a UnitHandle alive), at every stage, so a
  // loop that runs at stage 0 also runs at stage 3.
  // A frozen unit has none (and needs no done()).
  GradHandle grads(int unit);
  // Unit u gets no gradient in this micro-step (a branch not taken, an
  // expert no token reached): it contributes zeros to the reduction, as a
  // grads(u) left untouched and done() would, with no gather (at stage 3,
  // no all-gather of parameters only to pair them with zeros). Its
  // reduction is still a collective that every rank joins. Not after
  // grads(u) in the same micro-step (call done() on that handle).
  void no_grads(int unit);
  // Multiply the loss by this before backward (the fp16 loss scale; 1
  // otherwise).
  double loss_scale() const;

  // Call once per micro-step, after every trainable unit's gradients are
  // done.
  StepResult step();

  // --- learning rate ---
  //
  // An optimizer step's learning rate is, first found: the value of the
  // last set_lr(); else the set_lr_schedule() callback at the number of
  // steps applied before it (0 for the first step); else the config's
  // scheduler (lr_schedule.h). StepResult::lr reports the one used.
  //
  // Checkpoints: a set_lr() value is saved and restored with the progress
  // (a fine-tuning run that loaded one calls clear_lr() to return to its
  // schedule). A callback is code, not state: it is not saved; set it again
  // after loading, and since it is a function of the applied steps, which
  // are restored, it resumes where it left off.
  using LrSchedule = std::function<double(int64_t applied_steps)>;
  // Every following step uses `lr` (finite, >= 0) until clear_lr().
  void set_lr(double lr);
  void clear_lr();
  // Replaces the config's scheduler; an empty function restores it. A
  // callback returning a negative or non-finite value fails the step.
  void set_lr_schedule(LrSchedule schedule);
  // The learning rate the next optimizer step will use.
  double next_lr() const;

  // --- progress ---
  //
  // StepResult::samples_per_second counts train_batch_size samples (micro
  // batch x accumulation x ranks) per optimizer step; tokens_per_second
  // needs the tokens of one rank's micro-batch, which only the program
  // knows: set them here (> 0; 0 forgets them), again whenever they change.
  // With steps_per_print set, rank 0 logs a progress line every that many
  // optimizer steps (Note [progress lines] in engine_progress.cpp).
  void set_tokens_per_micro_batch(int64_t tokens);

  // --- inspection ---

  const EngineConfig& config() const { return config_; }
  int stage() const { return config_.zero.stage; }
  DType compute_dtype() const { return compute_dtype_; }
  // What gradients are accumulated in across micro-steps, and kept in at
  // stages 2-3 (data_types.grad_accum_dtype): the compute dtype, or fp32.
  // Unset, ZEST takes the compute dtype at every stage (DeepSpeed takes fp32
  // for bf16 at stage 0), so that the stages stay bit-identical.
  DType grad_accum_dtype() const { return grad_accum_dtype_; }
  // What the master weights and the optimizer state are kept in: fp32, or
  // bf16 (EngineConfig::bf16_master_weights_and_grads, bf16_optimizer_states).
  DType master_dtype() const { return master_dtype_; }
  DType state_dtype() const { return state_dtype_; }
  // The compute stream given at construction.
  Stream stream() const { return stream_; }
  const ModelLayout& layout() const;
  Communicator& comm() const { return comm_; }
  // The ranks the model states are sharded over: comm() itself, or with
  // MiCS (zero.mics_shard_size, Note [MiCS] in config.h) this rank's group
  // of mics_shard_size ranks, a split of comm() whose counters() count the
  // gathers and reduce-scatters within the group. After finalize().
  Communicator& shard_comm() const;
  // MiCS: the ranks holding the same shard as this one, one per group, over
  // which the gradient shards are all-reduced once per optimizer step (its
  // counters() are the traffic that crosses groups). nullptr under flat
  // sharding. After finalize().
  Communicator* replica_comm() const;
  // hpZ (zero.zero_hpz_partition_size, Note [hpZ] in config.h): this rank's
  // group of H ranks, over which the secondary copy of the parameters is
  // gathered (its counters() are those gathers). nullptr without hpZ.
  // After finalize().
  Communicator* hpz_comm() const;
  // The fp32 master values of a whole unit (padded flat layout), gathered
  // from the shards. Collective.
  std::vector<float> unit_master(int unit);
  // One parameter's fp32 master values. Collective.
  std::vector<float> param_master(const std::string& name);
  MemoryReport memory_report() const;
  // Whether unit u's full parameters stay in memory between gathers, at one
  // address (stages 0-2; at stage 3 units of up to
  // stage3_param_persistence_threshold elements, and every unit on one rank
  // without offload_param, layout_constants.h); otherwise gather() brings
  // them into a new buffer each time (or finds them still gathered: the
  // reuse distance, a prefetch).
  bool persistent(int unit) const;

  // --- checkpoints (checkpoint.h builds on these) ---

  // What a resumed run needs besides the shards.
  struct Progress {
    int64_t applied_steps = 0;
    int64_t skipped_steps = 0;
    LossScalerState loss_scaler;
    std::optional<double> lr_override;  // set_lr()'s value, when set
  };
  Progress progress() const;
  // Micro-steps taken since the last optimizer step: 0 at a gradient
  // accumulation boundary, where a checkpoint may be saved.
  int micro_steps_pending() const;
  // Shard buffers per unit: 0 is the master weights, 1.. the optimizer's
  // state buffers (fp32, or bf16 as master_dtype() and state_dtype() say;
  // read_shard and write_shard take fp32 values either way).
  int shard_buffers() const { return 1 + config_.optimizer.state_buffers(); }
  // Host copies of this rank's owned shard of one buffer of unit u
  // (layout().unit(u).shard elements), wherever it lives (device or, with
  // offload, host memory). Not collective. A frozen unit has buffer 0
  // only: its values, in fp32.
  std::vector<float> read_shard(int unit, int buffer);
  // Refuses a NaN or Inf (naming the unit, the parameter and the element)
  // and leaves the shard as it was then.
  void write_shard(int unit, int buffer, std::span<const float> values);
  // Sets the progress, and rebuilds the compute-dtype parameters from the
  // master shards written with write_shard (all-gathering them where ranks
  // hold full parameters). Collective; only between optimizer steps.
  void restore(const Progress& progress);
  // A weights load that checks its values itself (import_hf), writing each
  // unit's shard straight from its read buffers, with no staging copy of the
  // shard and no second check. begin_shard_load(u, every_value) settles the
  // optimizer's update in flight and zeroes unit u's optimizer state.
  // `every_value`: the dtype of the values of every load_shard of unit u
  // until the load ends, where together they cover the whole shard (every
  // parameter and the padding); nullopt otherwise. Where it is the compute
  // dtype and the master weights are an fp32 copy of their own in host
  // memory, the master is not written: it is widened from the parameters
  // when first read (Note [a master widened when first read] in
  // engine_load.cpp), so such a load writes 2 bytes an element, not 6.
  // load_shard(u, at, values, dtype, n): master elements [at, at + n) of the
  // shard become `values` (fp32, fp16 or bf16, as the file stores them; the
  // caller has checked they are finite), each converted once into the
  // master's and the parameters' dtypes (a frozen unit: the parameters
  // only): a bf16 file into bf16 parameters is a copy of its bytes, with no
  // detour through fp32. finish_shard_load is restore() for shards written so:
  // the parameters are narrowed already, so it sets the progress and
  // gathers. Shards written with write_shard since the last restore() need
  // restore() instead. Not collective, except finish_shard_load.
  struct ShardLoad {
    // The shard is in host memory: load_shard may run on several threads
    // at once for disjoint ranges (else one call at a time, from this thread).
    bool threads = false;
    // Where load_shard of values of the compute dtype would only copy them:
    // the owned parameters (shard element i at byte i * elem_size), in host
    // memory, for the loader to read the file's bytes into without a copy.
    // Given for a frozen unit, and a unit whose master is widened later;
    // empty otherwise. Written so, a unit that then cannot be loaded (a
    // non-finite value) needs abandon_shard_load.
    std::span<std::byte> in_place;
  };
  ShardLoad begin_shard_load(int unit, std::optional<DType> every_value = std::nullopt);
  void load_shard(int unit, size_t at, const void* values, DType dtype, size_t n);
  void load_shard(int unit, size_t at, std::span<const float> values) {
    load_shard(unit, at, values.data(), DType::kFloat32, values.size());
  }
  // Unit u's load stops part-way (the loader found a value it refuses):
  // its parameters are narrowed again from its master, which the load left
  // as it was, or, for a frozen unit written through ShardLoad::in_place
  // (it has no other copy of its values), zeroed, so that no value of the
  // refused file stays. Its optimizer state stays zeroed.
  void abandon_shard_load(int unit);
  void finish_shard_load(const Progress& progress);
  // The master weights a load deferred (ShardLoad::in_place), widened from
  // the parameters now rather than by the first step() or shard read: to
  // time steps without that pass in the first. Not collective.
  void widen_deferred_masters();
  // Every rank's `mine` (the same length on every rank), rank by rank, over
  // the engine's own communicator (a split of comm(), so comm()'s counters
  // count only the model). Collective.
  std::vector<int64_t> all_gather_scalars(std::span<const int64_t> mine);
  // Index of the shard this rank owns (0 at stage 0, where one shard is all;
  // with MiCS its rank in its group, the index its replicas share).
  int partition() const;

 private:
  friend class UnitHandle;
  friend class GradHandle;
  struct UnitState;
  struct Impl;

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
  // engine_step.cpp
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
  std::unique_ptr<Impl> impl_;
  std::weak_ptr<const void> comm_alive_;
  std::weak_ptr<const void> allocator_alive_;
  std::weak_ptr<const void> host_allocator_alive_;  // expired: none borrowed
  Lifetime lifetime_;  // watched by the handles
};

}  // namespace zest
