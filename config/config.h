// The engine's configuration, with DeepSpeed's key names and defaults, so
// that a DeepSpeed (or Hugging Face) ds_config.json runs unchanged wherever
// ZEST has the features it uses.
//
//   // zest-example: run
//   #include "zest/config/config.h"
//   zest::AutoValues program;                 // what "auto" entries take
//   program.micro_batch_size = 8;
//   program.compute_dtype = zest::DType::kBFloat16;
//   program.hidden_size = 4096;
//   program.learning_rate = 2e-5;                // the file has no optimizer: AdamW
//   program.scheduler = zest::LrScheduleConfig{}; // nor a scheduler: a constant rate
//   zest::EngineConfig cfg = zest::parse_config_json(R"({
//       "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
//       "bf16": {"enabled": "auto"}, "memory_breakdown": false,
//       "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}})", program);
//   ZEST_CHECK(cfg.bf16 && cfg.zero.reduce_bucket_size == 4096 * 4096, "as filled from program");
//   ZEST_CHECK(cfg.ignored.size() == 1 && cfg.ignored[0].key == "memory_breakdown", "with the reason");
//   // The Engine derives the batch sizes it lacks from the world size
//   // (resolve_batch) and logs both lists once, from rank 0.
//   // load_config_file(path, program) reads a file.
//
// What a file may hold is DeepSpeed's own schema (deepspeed/runtime/config.py
// and its zero, offload, monitor and comms models, with their aliases and
// deprecated names, such as "bfloat16" for "bf16" and "max_live_parameters"
// for "stage3_max_live_parameters"):
//   - a key ZEST honours sets the field below;
//   - a key about something ZEST does not do (memory printouts, profilers,
//     monitors, autotuning, stage-3 fetch heuristics...) is
//     accepted, and listed in `ignored` with the reason;
//   - the model's split (tensor_parallel.autotp_size, pipeline.stages) is
//     read for the estimator and listed in `ignored`: the Engine takes the
//     split from the program's DeviceMesh, not from the file;
//   - a key that asks for a feature ZEST lacks (GPUDirect Storage,
//     1-bit optimizers, curriculum learning, compression...) is
//     refused with the feature's name;
//   - a key DeepSpeed itself would refuse is refused with the names allowed
//     there and the nearest one ("did you mean").
// The keys of DeepSpeed's schema are listed in config/ds_schema_keys.h,
// generated from its source by scripts/ds_config_keys.py (with the commit
// read); a test holds the reader to every one of them. A file is read as
// DeepSpeed's hjson.load reads it (comments, trailing commas, unquoted keys
// and strings), and strings in the sections DeepSpeed validates with
// pydantic (zero_optimization, fp16, bf16) are converted as pydantic does
// ("3", "1e-5", "yes"); elsewhere DeepSpeed passes a string on, and ZEST
// refuses it.
// Every problem of a file is found before anything is thrown: one zest::Error
// lists them all, each with its key path ("zero_optimization.stage").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zest/core/dtype.h"
#include "zest/nvme/aio_config.h"
#include "zest/optim/loss_scaler.h"
#include "zest/optim/lr_schedule.h"
#include "zest/optim/optimizer.h"

namespace zest {

struct ZeroConfig {
  int stage = 0;
  bool contiguous_gradients = true;
  // Elements; unset: reduce_bucket()'s rule, which overlaps at every size.
  std::optional<int64_t> reduce_bucket_size;
  int64_t allgather_bucket_size = 500'000'000;  // elements
  std::optional<bool> overlap_comm;             // unset: on for stage 3, as in DeepSpeed
  int64_t stage3_prefetch_bucket_size = 50'000'000;
  int64_t stage3_param_persistence_threshold = 100'000;
  int64_t stage3_max_live_parameters = 1'000'000'000;
  // Note [stage-3 reuse distance] (engine_gather.cpp): when a unit's handle
  // is released, the unit stays gathered if the recorded gather order uses
  // it again before this many parameters (elements of the units gathered in
  // between, persistent ones included) have gone by; 0 releases every unit
  // with its handle. DeepSpeed's default, 1e9, keeps a small model's units
  // gathered from forward to backward.
  int64_t stage3_max_reuse_distance = 1'000'000'000;

  // DeepSpeed's overlap_comm: gradient reductions on the engine's
  // communication stream, so they run while backward goes on (true), or on
  // the compute stream, in line with backward (false). The bits are the same
  // either way. On the host the communication stream then has a thread of
  // its own where a core is free for it (host_comm_thread), which also runs
  // stage 3's gathers and prefetches.
  bool overlap() const { return overlap_comm.value_or(stage == 3); }
  // ZEST's own, not a DeepSpeed key: whether overlap_comm on the host gives
  // the communication stream a thread of its own. Unset: as the
  // environment's ZEST_HOST_COMM_THREAD (1 or 0) says, or, unset too, where
  // each rank has a core to spare for it (Note [the host's communication
  // thread] in engine/host_comm_thread.cpp says why and how that is
  // counted).
  std::optional<bool> host_comm_thread;

  // Note [the reduce bucket rule]. The elements of done gradients collected
  // before a reduction is launched, for a model of `padded_numel` flat
  // elements. reduce_bucket_size when set; otherwise a quarter of the model,
  // at most DeepSpeed's 5e8: a bucket as large as the model (DeepSpeed's
  // default for any model under 5e8 elements) reduces nothing until the
  // last unit's done() and so overlaps nothing, while a quarter launches
  // about four reductions, the first three behind the rest of backward, at
  // any size. At stage 3 it is also at most stage3_prefetch_bucket_size
  // (when that is positive), so a prefetch queued on the communication stream
  // waits behind at most one prefetch window of reductions, not a whole
  // bucket.
  int64_t reduce_bucket(size_t padded_numel) const;

  // Note [reduce at the accumulation boundary]. Stages 0-1 only, off by
  // default. On, each rank adds its micro-steps' gradients locally (in a
  // second full-size gradient buffer, in the compute dtype) and reduces once,
  // at the optimizer step's last micro-step: gradient_accumulation_steps times
  // fewer reductions and bytes, as DDP's no_sync() and DeepSpeed's stages 0-1
  // (which always do this, and have no key for it). Off, every micro-step is
  // averaged over the ranks and then added, as at stages 2-3. The two compute
  // avg(sum) and sum(avg): equal in exact arithmetic, not bit-identical in
  // floating point (and so not bit-identical to stages 2-3), except where
  // every sum is exact (integer-valued gradients and a power-of-two world).
  // No DeepSpeed key maps to it. An Error at stages 2-3, which keep only the
  // owned shard of the gradients between micro-steps.
  bool reduce_at_accumulation_boundary = false;

  // Note [MiCS]. DeepSpeed's mics_shard_size (MiCS, the placement FSDP2
  // calls HSDP): at stage 3, the model states are sharded within groups of
  // mics_shard_size consecutive ranks (ranks [g S, (g+1) S)) and replicated
  // across the groups. Each micro-step reduce-scatters the gradients within
  // the group (averaging over its S ranks); at the accumulation boundary
  // the accumulated shard is divided by the R = world / S replicas and
  // summed over the ranks that hold the same shard, one per group, before
  // the norm and the optimizer step (DeepSpeed's MiCS_Optimizer
  // allreduce_mics_shard_grads). So only 1/S of the gradients crosses
  // groups, once per optimizer step, and the parameter gathers stay within
  // the group. 0 or negative: off (DeepSpeed's -1 default), as is S equal
  // to the world size, which is flat sharding. S must divide the world
  // size. DeepSpeed builds MiCS only at stage 3 (a file's value at stages
  // 0-2 is ignored, as DeepSpeed ignores it; set in code, the Engine
  // refuses it), and not with offload_optimizer ("Local sharding has no
  // support for CPU offloading"), which the Engine refuses too.
  int mics_shard_size = -1;
  // DeepSpeed's mics_hierarchical_params_gather: gathers the parameters in
  // two steps (across hosts, then within) when a group spans hosts. The
  // values gathered are the same; ZEST gathers within the group in one
  // all-gather, so it is read and noted, not applied.
  bool mics_hierarchical_params_gather = false;

  // MiCS's shard size on a world of `world` ranks: the ranks model states
  // are sharded over (`world` when MiCS is off or the group is the world).
  int shard_group_size(int world) const {
    return stage == 3 && mics_shard_size > 0 && mics_shard_size < world ? mics_shard_size : world;
  }
  // Throws an Error naming what to change unless MiCS, where it applies
  // (stage 3), can run on `world` ranks: mics_shard_size must divide the
  // world (DeepSpeed asserts the same), and it has no CPU offload.
  void check_mics(int world, bool offloads_optimizer) const;

  // Note [hpZ]. ZeRO++'s hierarchical partitioning (zero_hpz_partition_size,
  // H): at stage 3 the model states stay sharded over every rank, and each
  // rank also keeps a secondary copy of the parameters, sharded over its
  // group of H consecutive ranks (a host's, typically: ranks [k H, (k+1) H)),
  // made from a unit's first gather after an optimizer step, which spans the
  // world. While it exists, the unit's gathers (backward's, and the forward
  // of later micro-steps) all-gather it within the group instead. Every
  // optimizer step drops the copies (DeepSpeed's
  // invalidate_secondary_tensor), as do restore() and loads. The values are
  // those of flat stage 3; the gathers that cross groups fall to one per
  // unit and step, the others moving (H-1)/H of a unit within the group,
  // at the cost of padded / H more elements per gathered unit while the
  // copies live. 1 (DeepSpeed's default) or 0: off; H at
  // least the world size is flat stage 3 (DeepSpeed takes min(H, world)).
  // DeepSpeed reads it at stage 3 only (a file's value elsewhere is
  // ignored; set in code, the Engine refuses it). H must divide the world;
  // ZEST refuses it with mics_shard_size and with offload_param.
  int zero_hpz_partition_size = 1;
  // hpZ's group size on `world` ranks, 0 when no secondary copy is kept.
  int hpz_group_size(int world) const {
    return stage == 3 && zero_hpz_partition_size > 1 && zero_hpz_partition_size < world ? zero_hpz_partition_size
                                                                                         : 0;
  }
  // Throws an Error naming what to change unless hpZ, where it applies,
  // can run on `world` ranks.
  void check_hpz(int world, bool offloads_params) const;
};

// zero_optimization.offload_optimizer / offload_param (DeepSpeed's
// DeepSpeedZeroOffloadOptimizerConfig and ...ParamConfig, with their
// defaults): where the fp32 master weights and optimizer state, or the
// parameters not in use, live. A file's "nvme" device (ZeRO-Infinity) loads
// with its NVMe keys (nvme_path, required; the optimizer's buffer_count,
// pipeline_read/write, fast_init; the parameters' buffer_count, buffer_size
// and max_in_cpu) and the top-level `aio` section. The Engine runs
// offload_optimizer "nvme": the offloaded master weights and optimizer state
// in a swap file per rank under nvme_path, streamed through buffer_count
// aligned host buffers at each step (engine/detail/offload_swap.h), and, with it,
// offload_param "nvme": the parameter shards past max_in_cpu in a second
// swap file, read through buffer_count buffers of at most buffer_size
// elements when gathered (engine/detail/param_swap.h). With any other device the NVMe
// keys are read (type and range checked) and noted as ignored, as DeepSpeed
// reads them only for "nvme". The deprecated cpu_offload /
// cpu_offload_param (true) are read as {"device": "cpu"};
// cpu_offload_use_pin_memory, which DeepSpeed no longer applies, is ignored.
enum class OffloadDevice { kNone, kCpu, kNvme };

struct OffloadOptimizerConfig {
  // kCpu: ZeRO-Offload, at stages 1-3 (a file's cpu at stage 0 is ignored,
  // as DeepSpeed ignores it; set in code, the Engine refuses it).
  OffloadDevice device = OffloadDevice::kNone;
  bool pin_memory = false;  // DeepSpeed's default; page-locked host memory on CUDA
  // The fraction of the owned optimizer state offloaded, in [0, 1]. A file
  // may set it below 1 only at stage 3, as DeepSpeed checks
  // (offload_ratio_check); in code the Engine takes it at stages 1-3.
  double ratio = 1.0;
  // ZeRO-Offload's one-step delayed parameter update (DPU); off by default.
  // No DeepSpeed key sets it: DeepSpeed has no DPU.
  bool delayed_update = false;
  // kNvme only (DeepSpeed's defaults): the directory of the swap files, the
  // ring's buffers, and DeepSpeed's swapper's pipelining switches (read
  // and kept; nvme/swap_ring.h always overlaps reads and writes).
  std::string nvme_path;
  int64_t buffer_count = 4;
  bool pipeline_read = false, pipeline_write = false, fast_init = false;
};

struct OffloadParamConfig {
  // kCpu: at stage 3, the shards of the units gathered on demand live in
  // host memory and come to the device when gathered (a file's cpu at stages
  // 0-2 is ignored, as DeepSpeed ignores it). The Engine runs it with
  // offload_optimizer device cpu at ratio 1, whose host update writes them.
  OffloadDevice device = OffloadDevice::kNone;
  bool pin_memory = false;
  // kNvme only, in DeepSpeed and so here (its defaults): the swap files'
  // directory, the prefetch buffers (buffer_count of buffer_size elements
  // of the compute dtype, which each shard on NVMe must fit) and how many
  // elements of the trainable shards stay in host memory (max_in_cpu: the
  // first units' while they fit); engine/detail/param_swap.h. The Engine runs it
  // at stage 3 with offload_optimizer kNvme at ratio 1.
  std::string nvme_path;
  int64_t buffer_count = 5, buffer_size = 100'000'000, max_in_cpu = 1'000'000'000;  // elements
};

// Whether `optimizer` is what offload_param at stage 3 runs with: device cpu
// or nvme at ratio 1, so that the host update is the only writer of the
// offloaded shards (Note [offload_param runs with the optimizer on the host], in
// engine.cpp). The Engine and the estimator both apply it.
inline bool carries_offloaded_params(const OffloadOptimizerConfig& optimizer) {
  return optimizer.device != OffloadDevice::kNone && optimizer.ratio >= 1.0;
}

struct Fp16Config {
  bool enabled = false;
  double loss_scale = 0.0;  // 0: dynamic
  int initial_scale_power = 16;
  int64_t loss_scale_window = 1000;
  int hysteresis = 2;
  bool consecutive_hysteresis = false;
  double min_loss_scale = 1.0;

  LossScalerConfig scaler() const;
};

// A key of a config file and what became of it.
struct ConfigNote {
  std::string key;   // its path: "zero_optimization.sub_group_size"
  std::string text;  // why it is ignored, or the value "auto" became and why
};

// Values the program knows, for a file's "auto" entries, filled after
// Hugging Face's Trainer (transformers/integrations/deepspeed.py):
//   train_micro_batch_size_per_gpu   micro_batch_size
//   gradient_accumulation_steps      gradient_accumulation_steps
//   train_batch_size                 world_size x micro x accumulation (when
//                                    world_size is given; otherwise left for
//                                    the Engine to derive at the real size)
//   fp16.enabled, bf16.enabled       compute_dtype
//   zero_optimization.reduce_bucket_size                 hidden_size^2
//   zero_optimization.stage3_prefetch_bucket_size        0.9 x hidden_size^2
//   zero_optimization.stage3_param_persistence_threshold 10 x hidden_size
//   gradient_clipping                gradient_clipping
//   optimizer.params lr, betas, eps, weight_decay
//                                    learning_rate, betas, eps, weight_decay
//   scheduler.params warmup_min_lr   0; warmup_max_lr: learning_rate
//   scheduler.params warmup_num_steps, total_num_steps
//                                    warmup_steps, total_steps
// A file without an "optimizer" section leaves the optimizer to the program
// (DeepSpeed then steps the client's): AutoValues::optimizer when set,
// otherwise the AdamW Hugging Face's Trainer builds from learning_rate,
// weight_decay (0 unless given), betas and eps; with neither it is an
// error naming them. A file without a "scheduler" section takes
// AutoValues::scheduler (LrScheduleConfig{} is a constant rate); unset, an
// error. What was used is noted in EngineConfig::auto_filled.
// An "auto" the program leaves unfilled takes the key's default (what
// DeepSpeed does with one), noted in EngineConfig::auto_filled; one without
// a default (total_num_steps) is an error naming the field to set. Where
// the file writes a value and the program gives another, the file's is used
// and the difference is listed in EngineConfig::mismatched (Hugging Face
// refuses the file instead; ZEST loads it and the Engine warns, because a
// file that names every value is complete as it stands).
struct AutoValues {
  std::optional<int64_t> micro_batch_size;
  std::optional<int64_t> gradient_accumulation_steps;
  std::optional<int> world_size;
  // Ranks on this host: the launcher's local size
  // (detect_launch_env().local_world_size, from LOCAL_WORLD_SIZE,
  // OMPI_COMM_WORLD_LOCAL_SIZE, ...). What "auto" makes mics_shard_size and
  // zero_hpz_partition_size: groups of one host's ranks (a ZEST extension:
  // DeepSpeed takes only numbers there).
  std::optional<int> local_world_size;
  std::optional<DType> compute_dtype;  // kFloat32, kFloat16 or kBFloat16
  std::optional<int64_t> hidden_size;
  std::optional<double> learning_rate;
  std::optional<double> weight_decay;
  std::optional<double> beta1, beta2;  // Adam's betas, both or neither
  std::optional<double> eps;
  std::optional<double> gradient_clipping;
  std::optional<int64_t> warmup_steps;
  std::optional<int64_t> total_steps;
  // The program's own optimizer and schedule, for a file without the
  // section (above).
  std::optional<OptimizerConfig> optimizer;
  std::optional<LrScheduleConfig> scheduler;
};

struct EngineConfig {
  // DeepSpeed's batch triple; any two determine the third (resolve_batch).
  std::optional<int64_t> train_batch_size;
  std::optional<int64_t> train_micro_batch_size_per_gpu;
  std::optional<int64_t> gradient_accumulation_steps;
  double gradient_clipping = 0.0;  // 0: off
  ZeroConfig zero;
  Fp16Config fp16;
  bool bf16 = false;
  // DeepSpeed's bf16.bf16_master_weights_and_grads and
  // bf16.bf16_optimizer_states: the master weights (and the gradients they
  // are stepped from), and the optimizer's state, kept in bf16 instead of
  // fp32 (Note [bf16 master weights and optimizer state] in
  // optim/optimizer.h). With DeepSpeed's rules: bf16 compute, ZeRO stage
  // 1-3, the state only with the master, and bf16 master weights over fp32
  // state only with offload_optimizer (the Engine checks them).
  bool bf16_master_weights_and_grads = false;
  bool bf16_optimizer_states = false;
  OptimizerConfig optimizer;
  LrScheduleConfig scheduler;
  // DeepSpeed's data_types.grad_accum_dtype: the dtype gradients are
  // accumulated in across micro-steps (fp32, fp16 or bf16). Unset:
  // DeepSpeed's default, which is fp32 for bf16 without ZeRO (stage 0) and
  // the compute dtype otherwise.
  std::optional<DType> grad_accum_dtype;
  OffloadOptimizerConfig offload_optimizer;
  OffloadParamConfig offload_param;
  // The top-level `aio` section (nvme/aio_config.h): the NVMe tier's I/O.
  AioConfig aio;
  // How gradients are averaged over the ranks, as DeepSpeed's
  // prescale_gradients and gradient_predivide_factor say (Note [gradient
  // predivision] in engine/engine_grads.cpp): divided before the reduction
  // (by the world size, or by the factor and the rest after), instead of
  // averaged by it.
  bool prescale_gradients = false;
  double gradient_predivide_factor = 1.0;
  // DeepSpeed's steps_per_print (unset: no progress lines) and
  // wall_clock_breakdown: rank 0 logs a line every steps_per_print optimizer
  // steps (applied or skipped), with the phase times when
  // wall_clock_breakdown is on (Engine::step).
  std::optional<int64_t> steps_per_print;
  bool wall_clock_breakdown = false;
  // DeepSpeed's activation_checkpointing.cpu_checkpointing: what a
  // checkpointed unit keeps for its recomputation (its inputs) waits in host
  // memory (TorchModule::checkpoint; the model chooses which units, as it
  // calls deepspeed.checkpointing.checkpoint). The section's other keys are
  // noted with why they do not apply.
  bool checkpoint_in_host_memory = false;
  // The model's split, as the file gives it: tensor_parallel.autotp_size
  // (DeepSpeed's AutoTP) and pipeline.stages. The Engine splits no model
  // (the program builds its DeviceMesh and layers and passes
  // mesh.engine_model_parallel() to Engine::set_model_parallel; both keys
  // are noted in `ignored` saying so), but refuses at finalize() an AutoTP
  // size other than the tp it was given; EstimateOptions::from_config and
  // zest-estimate take them as the mesh's tp and pp.
  int tensor_parallel_size = 1;
  int pipeline_stages = 1;

  // Keys of the file that ZEST accepted without acting on them, with the
  // reason, and the values its "auto" entries became: the Engine logs both
  // once, from rank 0, when it is constructed.
  std::vector<ConfigNote> ignored;
  std::vector<ConfigNote> auto_filled;
  // Written values that differ from the program's AutoValues (the written
  // one is used): logged as a warning, once, from rank 0.
  std::vector<ConfigNote> mismatched;
  // What DeepSpeed warns about and runs anyway (a schedule whose
  // total_num_steps is not past its warmup): logged as a warning, once.
  std::vector<ConfigNote> warnings;

  // fp16, bf16 or fp32: what parameters and gradients are stored in. Throws
  // when fp16 and bf16 are both enabled.
  DType compute_dtype() const;
  // What the master weights and the optimizer state are kept in: fp32, or
  // bf16 as the two keys above say.
  DType master_dtype() const { return bf16_master_weights_and_grads ? DType::kBFloat16 : DType::kFloat32; }
  DType optimizer_state_dtype() const { return bf16_optimizer_states ? DType::kBFloat16 : DType::kFloat32; }

  // Micro-steps per optimizer step: gradient_accumulation_steps once
  // resolve_batch has run (the Engine runs it), 1 when unset.
  int64_t accumulation_steps() const { return gradient_accumulation_steps.value_or(1); }

  // DeepSpeed's batch rules (runtime/config.py, _configure_train_batch_size)
  // at `world_size` data-parallel ranks, with its integer divisions:
  //   all three given        checked as they are
  //   batch and micro        accumulation = batch / micro / world
  //   batch and accumulation micro = batch / world / accumulation
  //   micro and accumulation batch = micro x accumulation x world
  //   batch alone            accumulation 1, micro = batch / world
  //   micro alone            accumulation 1, batch = micro x world
  // then batch == micro x accumulation x world, each at least 1, or an Error
  // with the arithmetic. Where DeepSpeed refuses a config with neither batch
  // nor micro (its data loader needs one), ZEST, which loads no data, takes
  // accumulation as given (1 when unset) and leaves the two unset.
  void resolve_batch(int world_size);
  // "train_batch_size 32 = micro 8 x accumulation 4 x 1 rank", after
  // resolve_batch; empty when neither batch size is known.
  std::string batch_summary(int world_size) const;
};

// `json_text` holds a DeepSpeed config; `program` fills its "auto" entries.
// Throws a zest::Error listing every problem.
EngineConfig parse_config_json(std::string_view json_text, const AutoValues& program = {});
// The same for a file; errors name it.
EngineConfig load_config_file(const std::string& path, const AutoValues& program = {});

}  // namespace zest
