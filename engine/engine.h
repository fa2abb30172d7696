// The ZeRO engine: holds a model's parameters, gradients, master weights
// and optimizer state, sharded across the data-parallel ranks of a
// communicator, around a training loop whose forward and backward are the
// user's own. Stages 0-3 (zero_optimization.stage), mixed precision, the
// offload of the optimizer and of the parameters to host memory and NVMe,
// MiCS and hpZ: docs/ENGINE.md, "Design", says what each does and why; its
// state and internals are engine/detail/engine_state.h's.
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
// Every stage gives the parameters of stage 0 bit for bit on the in-process
// backend: gradients are averaged each micro-step, every operation on them
// is elementwise, and the norm is an exact sum of per-chunk sums
// (optim/grad_norm.h).
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
#include "zest/engine/memory_report.h"
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
  // Where unit u's gradients are in this micro-step: not opened yet, open
  // (grads(u) was called), or done (done() or no_grads(u)); every unit is
  // kIdle again once step() ends the micro-step. A frozen unit stays kIdle.
  enum class GradState { kIdle, kOpen, kDone };
  GradState grad_state(int unit) const;
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

  const EngineConfig& config() const;
  int stage() const;
  DType compute_dtype() const;
  // What gradients are accumulated in across micro-steps, and kept in at
  // stages 2-3 (data_types.grad_accum_dtype): the compute dtype, or fp32.
  // Unset, ZEST takes the compute dtype at every stage (DeepSpeed takes fp32
  // for bf16 at stage 0), so that the stages stay bit-identical.
  DType grad_accum_dtype() const;
  // What the master weights and the optimizer state are kept in: fp32, or
  // bf16 (EngineConfig::bf16_master_weights_and_grads, bf16_optimizer_states).
  DType master_dtype() const;
  DType state_dtype() const;
  // The compute stream given at construction.
  Stream stream() const;
  const ModelLayout& layout() const;
  Communicator& comm() const;
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
  int shard_buffers() const;
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
  friend class UnitHandle;  // their views and releases go through impl_
  friend class GradHandle;
  class Impl;  // engine/detail/engine_state.h
  std::unique_ptr<Impl> impl_;
};

}  // namespace zest
