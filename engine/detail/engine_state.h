// Internal: the engine's per-unit buffers and bookkeeping (not installed).
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

struct Engine::UnitState {
  enum class Grads { kIdle, kOpen, kDone };

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

struct Engine::Impl {
  std::vector<ParamGroupSpec> groups;
  std::vector<UnitSpec> specs;
  std::unique_ptr<ModelLayout> layout;
  std::unique_ptr<Communicator> control;  // scalars: digests, norms, broadcasts
  // MiCS (Note [MiCS] in config.h): the shard and replica groups, and a
  // split of the shard group for its scalars (norms, master gathers). All
  // null under flat sharding, where the engine's communicator and `control`
  // serve instead (Engine::shard_group, shard_control). With hpZ, its group.
  ShardGroups mics;
  std::unique_ptr<Communicator> mics_control;
  // set_model_parallel(): the model-parallel group and coordinates; and,
  // on tp ranks other than 0, the ranges of each unit's shard (relative to
  // its start) holding tp_replicated parameters, which the norm skips
  // there; `replicated_only`: the whole shard is such (or padding).
  ModelParallel mp;
  std::vector<std::vector<std::pair<size_t, size_t>>> tp_duplicates;
  std::vector<char> replicated_only;
  std::optional<OwnedStream> comm_stream;
  std::optional<Event> handoff;  // compute -> comm ordering
  std::vector<UnitState> units;

  // The owned region's elements [0, host_numel) are offloaded; the device
  // holds [host_numel, owned()) in these.
  Buffer master;    // fp32 (16-bit compute only; fp32: the parameters)
  Buffer state[2];  // optimizer state
  size_t host_numel = 0;
  std::unique_ptr<OptimizerOffload> offload;  // with host_numel > 0
  // offload_param nvme: the shards past max_in_cpu (engine/detail/param_swap.h).
  std::unique_ptr<ParamSwap> param_swap;
  LossScaler scaler;

  int part = 0;  // this rank's shard index (0 at stage 0)
  int micro = 0; // micro-steps done in this accumulation
  // ZeroConfig::reduce_at_accumulation_boundary with more than one
  // micro-step: gradients are added locally and reduced at the last.
  bool local_accumulation = false;
  int64_t applied = 0;
  int64_t skipped = 0;
  std::optional<double> lr_override;  // set_lr()
  LrSchedule lr_schedule;             // set_lr_schedule()

  // Units whose gradients are done and not yet reduced, and their size.
  std::vector<int> pending;
  size_t pending_numel = 0;

  // Stage 3 prefetch and reuse: a recorded order per kind of pass, the one
  // of the latest gather, and whether an inference pass has begun and not
  // ended (Note [a gather order per kind of pass], engine_gather.cpp).
  RecordedOrder orders[2];
  Pass pass = Pass::kTraining;
  bool inference_open = false;
  size_t live_numel = 0;

  std::unique_ptr<LambPlan> lamb;  // the first LAMB step builds it

  StepTimes times;  // since the last boundary (StepResult::times)
  // Throughput: set_tokens_per_micro_batch(), and when the current optimizer
  // step's work began (unset until its first gather() or grads()).
  int64_t tokens_per_micro = 0;
  std::optional<std::chrono::steady_clock::time_point> step_start;

  explicit Impl(LossScalerConfig scaler_config) : scaler(scaler_config) {}

  Stream comm() const { return comm_stream->get(); }
  RecordedOrder& order() { return orders[static_cast<int>(pass)]; }
  const RecordedOrder& order() const { return orders[static_cast<int>(pass)]; }
};

}  // namespace zest
