// step(): the end of a micro-step, and on the last of an accumulation the
// optimizer step: global gradient norm (which also detects overflow and
// non-finite values, agreed across ranks), loss-scale update, clipping, the
// optimizer on the owned shards, and the all-gather of updated parameters.
#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/engine/layout_constants.h"
#include "zest/memory/copy.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/grad_norm.h"
#include "zest/optim/lr_schedule.h"
#include "zest/optim/optimizer.h"
#include "zest/optim/step_decision.h"

namespace zest {

void Engine::Impl::end_micro_step() {
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  int done = 0, trainable = 0;
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitState& st = im.units_[static_cast<size_t>(u)];
    ZEST_CHECK(st.gathered == 0,
               "step() while unit '{}' is gathered: release every UnitHandle first (at stage 3 "
               "step() updates the shards, not a gathered copy)",
               L.unit(u).name);
    done += st.grads == UnitState::Grads::kDone ? 1 : 0;
    trainable += L.unit(u).frozen ? 0 : 1;
  }
  ZEST_CHECK(done > 0,
             "step() without gradients: no unit's GradHandle::done() was called in this "
             "micro-step{}",
             trainable == 0 ? " (every unit is frozen: there is nothing to train)" : "");
  for (int u = 0; u < L.num_units(); ++u) {
    ZEST_CHECK(L.unit(u).frozen || im.units_[static_cast<size_t>(u)].grads == UnitState::Grads::kDone,
               "step(): the gradients of unit '{}' are not done in this micro-step ({} of {} "
               "trainable units are); every trainable unit's GradHandle::done() must be called once per micro-step",
               L.unit(u).name, done, trainable);
  }
  flush_reductions();
  // Everything after (the next micro-step's zeroing, the optimizer) reads
  // what the reductions wrote.
  im.handoff_->record(im.comm_queue());
  {
    // On the host's communication thread, what of the reductions backward
    // did not hide.
    const PhaseTimer timer(im.times_.reduce_ms);
    stream_.wait(*im.handoff_);
  }
  for (UnitState& st : im.units_) st.grads = UnitState::Grads::kIdle;
  // Unused prefetches (a kept unit was released at its last use: Note
  // [stage-3 reuse distance]). Nothing gathered outlives the micro-step, so
  // no copy from before an optimizer step is used after it. No unit is held
  // (checked above), so ending an inference pass left open drops them all.
  if (im.inference_open_) {
    end_inference_pass();
  } else {
    drop_unheld();
  }
  RecordedOrder& training = im.orders_[static_cast<int>(Pass::kTraining)];
  if (training.recording) training.ends.push_back(training.units.size());
  ++im.micro_;
}

// The reduced, accumulated gradient of unit u's owned shard.
const void* Engine::Impl::reduced_grad(int unit) const {
  const UnitState& st = units_[static_cast<size_t>(unit)];
  return st.grad_acc && !local_accumulation_ ? st.grad_acc.data() : owned_part(st.grads_full, unit);
}

DType Engine::Impl::reduced_grad_dtype(int unit) const {
  const UnitState& st = units_[static_cast<size_t>(unit)];
  return st.grad_acc && !local_accumulation_ ? grad_accum_dtype_ : compute_dtype_;
}

// The square of the global norm of the gradients times `scale`, as
// kExactWords words in `sums` (a new workspace) on the stream's device: each
// rank sums its own shard's chunks and adds them exactly (grad_norm.h), and
// an int64 all-reduce adds the ranks' exact sums, so every rank, world size
// and stage gets the same bits. Memory and work O(shard / 256); kExactWords
// words on the wire. Queued only: nothing here waits for the device.
int64_t* Engine::Impl::global_sum_of_squares(float scale, Buffer& sums) {
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  const PhaseTimer timer(im.times_.norm_ms);
  const size_t chunks = L.trainable_owned() / kShardQuantum;
  sums = allocator_.allocate_buffer(chunks * 8 + kExactWords * 8, stream_, MemoryCategory::kCommBuffers);
  auto* exact = reinterpret_cast<int64_t*>(sums.as<double>() + chunks);
  Buffer masked;  // a shard with its tp-replicated parameters zeroed (tp rank > 0)
  for (int u = 0; u < L.num_units(); ++u) {
    if (L.unit(u).frozen) continue;
    double* out = sums.as<double>() + L.trainable_offset(u) / kShardQuantum;
    const size_t shard = L.unit(u).shard;
    const bool skip_some = !im.tp_duplicates_.empty() && !im.tp_duplicates_[static_cast<size_t>(u)].empty();
    if (skip_some && im.replicated_only_[static_cast<size_t>(u)]) {
      fill_zero(stream_, out, shard / kShardQuantum * sizeof(double));  // counted on tp rank 0
      continue;
    }
    const void* grad = reduced_grad(u);
    if (skip_some) {
      // Zeros add nothing to a chunk's sum, and leave every other element's
      // place in it where it was.
      const size_t es = elem_size(reduced_grad_dtype(u));
      masked = allocator_.allocate_buffer(shard * es, stream_, MemoryCategory::kCommBuffers);
      copy_bytes(stream_, masked.data(), grad, shard * es);
      for (const auto& [a, b] : im.tp_duplicates_[static_cast<size_t>(u)]) {
        fill_zero(stream_, masked.as<std::byte>() + a * es, (b - a) * es);
      }
      grad = masked.data();
    }
    chunk_sums_of_squares(stream_, grad, reduced_grad_dtype(u), shard, kShardQuantum, scale, out);
  }
  fill_zero(stream_, exact, kExactWords * 8);
  accumulate_exact(stream_, sums.as<double>(), chunks, exact);
  if (L.partitions() > 1) shard_control().all_reduce(exact, exact, kExactWords, DType::kInt64, ReduceOp::kSum, stream_);
  // Model parallelism: the other slices and stages of the model. Integer
  // sums: the same total whatever the grouping of the additions.
  if (im.mp_.group != nullptr) im.mp_.group->all_reduce(exact, exact, kExactWords, DType::kInt64, ReduceOp::kSum, stream_);
  return exact;
}

void Engine::Impl::find_tp_duplicates() {
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  im.tp_duplicates_.assign(static_cast<size_t>(L.num_units()), {});
  im.replicated_only_.assign(static_cast<size_t>(L.num_units()), 0);
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitLayout& unit = L.unit(u);
    const size_t begin = unit.shard * static_cast<size_t>(im.part_);
    const size_t end = begin + unit.shard;
    const UnitSpec& spec = im.specs_[static_cast<size_t>(u)];
    auto& ranges = im.tp_duplicates_[static_cast<size_t>(u)];
    bool any_split = false;
    for (const ParamLayout& p : unit.params) {
      const auto it = std::find_if(spec.params.begin(), spec.params.end(),
                                   [&](const ParamSpec& s) { return s.name == p.name; });
      const bool replicated = it != spec.params.end() && it->tp_replicated;
      const size_t a = std::max(begin, p.offset);
      const size_t b = std::min(end, p.offset + p.numel);
      if (a >= b) continue;
      if (!replicated) {
        any_split = true;
        continue;
      }
      ranges.emplace_back(a - begin, b - begin);
    }
    im.replicated_only_[static_cast<size_t>(u)] = !ranges.empty() && !any_split;
  }
}

// Unit u's shard buffers from its first element on the device (after the
// host_numel offloaded ones): master, state, reduced gradient and the
// compute-dtype parameters (none where the master is them: fp32, bf16 master
// weights).
ShardBuffers Engine::Impl::device_shard(int u) {
  const UnitState& st = units_[static_cast<size_t>(u)];
  const size_t first = st.host_numel;
  ZEST_INTERNAL_ASSERT(!shard_on_host(u), "unit {}: a device update of parameters offloaded to the host", u);
  ShardBuffers b;
  b.master = shard_pieces(u, 0)[1].data;
  b.master_dtype = master_dtype_;
  for (int s = 1; s < shard_buffers(); ++s) b.state[s - 1] = shard_pieces(u, s)[1].data;
  b.state_dtype = state_dtype_;
  b.grad_dtype = reduced_grad_dtype(u);
  b.grad = static_cast<const std::byte*>(reduced_grad(u)) + first * elem_size(b.grad_dtype);
  b.param_dtype = compute_dtype_;
  b.param_out = master_is_params() ? nullptr : owned_params(u) + first * elem_size(compute_dtype_);
  b.numel = layout_->unit(u).shard - first;
  return b;
}

namespace {

// Note [an NVMe step agreed across ranks]: with offload_optimizer nvme on
// several ranks, the ranks tell each other whether their host part failed
// before any of them commits its step: the highest failed rank + 1 (a max
// over the world), 0 when none did. Collective: every rank calls it at
// every optimizer step of such a run, whether its own part ran or not.
int agreed_failed_rank(Communicator& comm, CachingAllocator& alloc, const Stream& stream, bool failed) {
  Buffer flag = alloc.allocate_buffer(sizeof(int64_t), stream, MemoryCategory::kCommBuffers);
  const int64_t mine = failed ? comm.rank() + 1 : 0;
  copy_bytes(stream, flag.data(), &mine, sizeof mine);
  comm.all_reduce(flag.data(), flag.data(), 1, DType::kInt64, ReduceOp::kMax, stream);
  int64_t any = 0;
  copy_bytes(stream, &any, flag.data(), sizeof any);
  stream.synchronize();
  return static_cast<int>(any);
}

}  // namespace

// Note [a failed NVMe step]: the offloaded parameters narrowed back from
// the master weights the failed step left as they were. A second failure
// (the drive is gone) is logged: the first one is what the caller sees.
void Engine::Impl::undo_offloaded_params() {
  try {
    for (int u = 0; u < layout_->num_units(); ++u) {
      // A shard in the parameter swap file was written to its other slot,
      // which the step never made current (Note [parameter swap regions]).
      if (units_[static_cast<size_t>(u)].host_numel > 0 && !shard_in_swap(u)) params_from_master(u);
    }
    stream_.synchronize();
  } catch (const std::exception&) {
    ZEST_LOG_WARN("offload_optimizer: the parameters could not be narrowed back from the master weights after a "
                  "failed step: {}; restore from a checkpoint",
                  current_exception_text());
  }
}

// Note [the step's phases]: step() is the end of a micro-step and, on the
// last of an accumulation, these phases in order:
//   begin_boundary      the gather order's pass ends; deferred masters widen
//   decide_update       gradients reduced across replicas, the global norm,
//                       and the decision (skip, clip) on the stream
//   apply_update        the optimizer on the owned shards: the device's part
//                       and offload_optimizer's host part, in the order and
//                       with the failure handling Note [a failed NVMe step]
//                       gives
//   gather_updated_params   the new parameters to the ranks that hold them
//   finish_step         the decision read back, the loss scale, the counts
//                       and the progress line
struct Engine::Impl::StepInFlight {
  double lr = 0;
  Buffer norm_workspace;  // the decision lives here; kept until the step synchronized
  Buffer lamb_workspace;  // likewise, for LAMB's kernels and reductions
  const StepDecision* decision = nullptr;  // where the stream reads it
  // Note [the step decides on the device]: in hand on the host only where
  // offload_optimizer's host part needs it before it runs.
  std::optional<StepDecision> known;
  StepScalars scalars() const {
    StepScalars s;
    s.lr = static_cast<float>(lr);
    s.decision = decision;
    return s;
  }
};

StepResult Engine::Impl::step() {
  check_finalized("step()");
  // The learning rate is settled before anything changes: a rate the update
  // cannot use (next_lr() refuses it) leaves the micro-step as it was, its
  // gradients done, so step() may be called again once it is fixed.
  const bool boundary = micro_ + 1 >= config_.accumulation_steps();
  StepInFlight pending;
  if (boundary) pending.lr = next_lr();
  end_micro_step();
  StepResult result;
  result.applied_steps = applied_;
  result.skipped_steps = skipped_;
  result.loss_scale = loss_scale();
  if (!boundary) return result;
  result.boundary = true;
  begin_boundary();
  decide_update(pending);
  {
    PhaseTimer timer(times_.optimizer_ms);
    apply_update(pending);
  }
  gather_updated_params();
  return finish_step(result, pending);
}

void Engine::Impl::begin_boundary() {
  micro_ = 0;
  // Training's gather order: recorded over the first iteration, replayed
  // after. When an iteration departed from it (a loop whose iterations
  // differ), the next iteration records it afresh.
  orders_[static_cast<int>(Pass::kTraining)].end_pass();
  // The update reads the master weights: a load's deferred ones (Note [a
  // master widened when first read]) are widened first, once.
  widen_deferred_masters();
}

// Note [the step decides on the device]. The norm, the skip and the clip
// coefficient are decided on the stream (step_decision.h) and the
// optimizer reads the decision there, so on a GPU nothing waits for the
// host between the norm and the update; the host reads the decision once
// the gather is queued too (with offload_optimizer the host updates its
// part, so it reads the decision before). The gather runs on a skipped
// step as well, moving unchanged values.
void Engine::Impl::decide_update(StepInFlight& step) {
  const double unscale = 1.0 / (static_cast<double>(config_.accumulation_steps()) * loss_scale());
  reduce_across_replicas();
  int64_t* words = global_sum_of_squares(static_cast<float>(unscale), step.norm_workspace);
  decide_step(stream_, words, unscale, config_.gradient_clipping);
  step.decision = decision_at(words);
  // The offloaded part is updated by the host, which needs the decision in
  // hand first: it waits for the norm (only) here, before the device's part
  // is queued.
  if (offload_) {
    StepDecision d;
    copy_bytes(stream_, &d, step.decision, sizeof d);
    stream_.synchronize();
    step.known = d;
  }
}

void Engine::Impl::update_device_shards(StepInFlight& step) {
  StepScalars scalars = step.scalars();
  scalars.step = applied_ + 1;
  if (config_.optimizer.kind == OptimizerKind::kLamb) {
    lamb_step(scalars, step.lamb_workspace);  // never offloaded: checked() refuses it
    return;
  }
  const ModelLayout& L = *layout_;
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitState& st = units_[static_cast<size_t>(u)];
    if (st.host_numel == L.unit(u).shard || L.unit(u).frozen) continue;
    // Base pointers once per unit, so shard_pieces's checks do not run per
    // run; each run is a part of them (from the first device element).
    const ShardBuffers base = device_shard(u);
    const size_t first = st.host_numel;
    for (const GroupRun& run : st.runs) {
      const size_t lo = std::max(run.begin, first);
      if (lo >= run.end) continue;
      scalars.weight_decay = L.groups()[static_cast<size_t>(run.group)].weight_decay;
      optimizer_step(stream_, config_.optimizer, base.part(lo - first, run.end - lo), scalars);
    }
  }
}

// offload_optimizer's part: the host updates the shards' host pieces; throws
// where it fails (a swap file's read, write or full drive).
void Engine::Impl::update_host_shards(const StepInFlight& step) {
  const ModelLayout& L = *layout_;
  std::vector<OffloadUnit> units;
  for (int u = 0; u < L.num_units(); ++u) {
    if (L.unit(u).frozen) continue;
    const UnitState& st = units_[static_cast<size_t>(u)];
    units.push_back({L.trainable_offset(u), st.host_numel, static_cast<const std::byte*>(reduced_grad(u)),
                     owned_params(u), &st.runs, {}});
    if (shard_in_swap(u)) {
      // Note [parameter swap regions]: to the unit's other slot, current
      // once the step has succeeded everywhere.
      units.back().put = [swap = param_swap_.get(), u](size_t at, const std::byte* values, size_t n) {
        swap->put_update(u, at, values, n);
      };
    }
  }
  std::vector<float> decay;
  for (const ParamGroupSpec& g : L.groups()) decay.push_back(g.weight_decay);
  StepScalars scalars = step.scalars();
  scalars.step = applied_ + 1;
  scalars.decision = nullptr;  // device memory on a GPU
  scalars.grad_scale = step.known->grad_scale;
  offload_->step(stream_, config_.optimizer, units, decay, scalars);
  const OffloadTimes t = offload_->take_times();
  times_.offload_d2h_ms += t.d2h_ms;
  times_.offload_update_ms += t.update_ms;
  times_.offload_h2d_ms += t.h2d_ms;
  times_.offload_ms += t.total_ms;
  times_.offload_read_wait_ms += t.read_wait_ms;
  times_.offload_write_wait_ms += t.write_wait_ms;
  times_.offload_chunk_ms += t.chunk_ms;
  times_.offload_chunk_overlapped_ms += t.chunk_overlapped_ms;
}

// Note [a failed NVMe step]: the host part in a swap file can fail (a
// read, a write, a full drive) where host memory cannot. Its master
// weights and state then stay as before the step (Note [offload swap
// regions]); the parameters it had already sent are narrowed back from
// them, and the device's part runs only after the host's succeeded, so a
// step() that throws leaves this rank as it was before it. On several
// ranks the failure is agreed before any rank goes on (Note [an NVMe step
// agreed across ranks]): where one rank's host part failed, every rank
// rolls its host part back (OffloadSwap::roll_back: the region the step
// read is the state before it) and throws, so the ranks stay in step and
// may call step() again. Otherwise the device's part goes first: on a
// GPU it is queued, and runs while the host updates the offloaded part.
void Engine::Impl::apply_update(StepInFlight& step) {
  const bool host_part = offload_ && step.known->finite != 0;
  // Reads ahead of the parameter swap file hold values the step replaces;
  // their buffers take the step's new values.
  if (param_swap_) param_swap_->drop_reads();
  const bool agree = config_.offload_optimizer.device == OffloadDevice::kNvme && comm_.size() > 1;
  const bool host_first = (host_part && offload_->swap() != nullptr) || agree;
  if (!host_first) update_device_shards(step);
  if (agree) {
    update_host_shards_agreed(step, host_part);
  } else if (host_part) {
    try {
      update_host_shards(step);
    } catch (...) {
      if (param_swap_) param_swap_->discard();
      if (host_first) undo_offloaded_params();
      throw;
    }
  }
  if (param_swap_) param_swap_->commit();
  if (host_first) update_device_shards(step);
}

void Engine::Impl::update_host_shards_agreed(const StepInFlight& step, bool host_part) {
  std::exception_ptr error;
  if (host_part) {
    try {
      update_host_shards(step);
    } catch (...) {
      error = std::current_exception();
    }
  }
  const int failed = agreed_failed_rank(comm_, allocator_, stream_, error != nullptr);
  if (failed == 0) return;
  if (param_swap_) param_swap_->discard();
  if (host_part && error == nullptr) offload_->roll_back();
  if (host_part) undo_offloaded_params();
  if (error != nullptr) std::rethrow_exception(error);
  ZEST_FAIL("offload_optimizer nvme: the step failed on rank {} (its error says why); this rank rolled its "
            "step back to the state before it, as every rank did, so the ranks stay in step: call step() "
            "again once the drive is fixed, or resume from a checkpoint",
            failed - 1);
}

StepResult Engine::Impl::finish_step(StepResult result, const StepInFlight& step) {
  StepDecision d;
  if (step.known) {
    d = *step.known;
  } else {
    copy_bytes(stream_, &d, step.decision, sizeof d);
  }
  stream_.synchronize();
  result.grad_norm = std::sqrt(d.sum_of_squares);
  const bool finite = d.finite != 0;
  if (config_.fp16.enabled) {
    const double before = scaler_.scale();
    scaler_.update(!finite);
    result.loss_scale = scaler_.scale();
    if (!finite) {
      result.skip_reason = fmt::format("fp16 overflow: step skipped, loss scale {} -> {}", before,
                                       result.loss_scale);
    }
  } else if (!finite) {
    result.skip_reason = fmt::format(
        "non-finite gradients ({}): step skipped. Look for a NaN or Inf in the loss or backward",
        dtype_name(compute_dtype_));
    ZEST_LOG_WARN("step {}: {}", applied_ + skipped_ + 1, result.skip_reason);
  }
  result.times = std::exchange(times_, StepTimes{});
  if (!finite) {
    // A delayed update in flight still lands: the parameters trail the
    // master by at most one applied step.
    settle_offload();
    result.skipped_steps = ++skipped_;
    report_progress(result, step.lr);
    return result;
  }
  result.lr = step.lr;
  result.clipped = d.clipped != 0;
  result.applied = true;
  result.applied_steps = ++applied_;
  report_progress(result, step.lr);
  return result;
}

namespace {

float max_weight_decay(const std::vector<ParamGroupSpec>& groups) {
  float most = 0.0f;
  for (const ParamGroupSpec& g : groups) most = std::max(most, g.weight_decay);
  return most;
}

}  // namespace

void Engine::Impl::set_lr(double lr) {
  check_learning_rate(config_.optimizer, lr, max_weight_decay(groups_), fmt::format("set_lr({})", lr));
  lr_override_ = lr;
}

void Engine::Impl::clear_lr() { lr_override_.reset(); }

void Engine::Impl::set_lr_schedule(LrSchedule schedule) { lr_schedule_ = std::move(schedule); }

double Engine::Impl::next_lr() const {
  const Impl& im = *this;
  const float decay = max_weight_decay(im.groups_);
  if (im.lr_override_) {
    check_learning_rate(config_.optimizer, *im.lr_override_, decay, fmt::format("set_lr({})", *im.lr_override_));
    return *im.lr_override_;
  }
  if (!im.lr_schedule_) {
    const double lr = lr_for_step(config_.scheduler, config_.optimizer.lr, im.applied_);
    check_learning_rate(config_.optimizer, lr, decay,
                        fmt::format("the config's scheduler ({}) after {} applied steps",
                                    lr_schedule_name(config_.scheduler.kind), im.applied_));
    return lr;
  }
  const double lr = im.lr_schedule_(im.applied_);
  check_learning_rate(config_.optimizer, lr, decay,
                      fmt::format("the lr schedule set with set_lr_schedule() after {} applied steps", im.applied_));
  return lr;
}

// Stages 1-2 (and persistent units at stage 3): every rank updated its part
// of the full parameters in place; the all-gather brings the other parts,
// in buckets of up to allgather_bucket_size elements.
void Engine::Impl::gather_updated_params(bool frozen_too) {
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  // hpZ: the parameters changed (or may have), so the secondary copies go,
  // as DeepSpeed's invalidate_secondary_tensor after every step; the next
  // gather of each unit spans the world again and makes a new one.
  for (UnitState& st : im.units_) st.params_secondary = Buffer();
  // Stage 3: a gathered copy not in use (a prefetch, or a unit kept for its
  // reuse) holds the parameters from before: gone, so the next gather
  // brings the new ones. (After a step there is none: end_micro_step()
  // dropped them; after a load there may be.)
  drop_unheld();
  if (L.partitions() == 1) return;
  const PhaseTimer timer(im.times_.gather_ms);
  Communicator& shards = shard_group();
  size_t bucket = 0;
  bool open = false;
  for (int u = 0; u < L.num_units(); ++u) {
    UnitState& st = im.units_[static_cast<size_t>(u)];
    const UnitLayout& U = L.unit(u);
    if (!st.resident || (U.frozen && !frozen_too)) continue;
    if (!open) {
      shards.group_start();
      open = true;
    }
    shards.all_gather(owned_part(st.params_full, u), st.params_full.data(), U.shard, compute_dtype_, stream_);
    bucket += U.padded;
    if (static_cast<int64_t>(bucket) >= config_.zero.allgather_bucket_size) {
      shards.group_end();
      open = false;
      bucket = 0;
    }
  }
  if (open) shards.group_end();
}

}  // namespace zest
