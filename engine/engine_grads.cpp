// grads() and done(): the gradient buffers backward writes, and their
// reduction. A unit's reduction is queued on the communication stream behind
// an event on the compute stream, so it overlaps the rest of backward
// (overlap_comm; off, it runs on the compute stream); done units are
// collected into a bucket (ZeroConfig::reduce_bucket) and launched as one
// group.
//
// Every micro-step's gradients are averaged over the ranks first (in the
// compute dtype) and then added to the previous micro-steps' (in
// grad_accum_dtype, widened first when that is fp32): the same
// elementwise arithmetic at every stage, which is what keeps the stages
// bit-identical. Stage 0 all-reduces; stages 1-3 reduce-scatter, so only the
// owned shard is reduced. ZeroConfig::reduce_at_accumulation_boundary
// (stages 0-1) trades that identity for fewer reductions: grads_done() adds
// the micro-steps locally and queues only the last one's.
#include <utility>

#include "zest/core/check.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/engine/gradient_division.h"
#include "zest/memory/copy.h"
#include "zest/optim/grad_ops.h"

namespace zest {

GradHandle Engine::Impl::grads(int unit) {
  UnitState& st = state(unit);
  start_step_clock();
  const UnitLayout& U = layout_->unit(unit);
  ZEST_CHECK(!U.frozen,
             "grads() of unit '{}', whose parameters are frozen (trainable = false): it has no gradients, and "
             "step() needs none from it",
             U.name);
  ZEST_CHECK(st.gathered > 0,
             "grads() of unit '{}', which is not gathered: hold a UnitHandle from gather() while "
             "writing its gradients (at stage 3 the parameters exist only then)",
             U.name);
  ZEST_CHECK(st.grads != UnitState::Grads::kDone,
             "grads() of unit '{}' after its done() in this micro-step: call step() before the "
             "next micro-step's backward",
             U.name);
  if (st.grads == UnitState::Grads::kIdle) open_grads(unit);
  return GradHandle(&self_, lifetime_.watch(), unit);
}

void Engine::Impl::open_grads(int unit) {
  UnitState& st = units_[static_cast<size_t>(unit)];
  const size_t bytes = layout_->unit(unit).padded * elem_size(compute_dtype_);
  if (!st.grads_full) st.grads_full = allocator_.allocate_buffer(bytes, stream_, MemoryCategory::kGradients);
  fill_zero(stream_, st.grads_full.data(), bytes);
  st.grads = UnitState::Grads::kOpen;
}

void Engine::Impl::no_grads(int unit) {
  UnitState& st = state(unit);
  start_step_clock();
  const UnitLayout& U = layout_->unit(unit);
  ZEST_CHECK(!U.frozen, "no_grads() of unit '{}', whose parameters are frozen: it has no gradients to reduce",
             U.name);
  ZEST_CHECK(st.grads == UnitState::Grads::kIdle,
             "no_grads() of unit '{}' after its grads() in this micro-step: call done() on that handle "
             "instead (its gradients are what backward wrote, zeros if nothing did)",
             U.name);
  open_grads(unit);
  grads_done(unit);
}

detail::UntypedSpan<void> Engine::Impl::grad_view(int unit, const std::string& name, DType dtype) const {
  const UnitState& st = units_[static_cast<size_t>(unit)];
  ZEST_CHECK(st.grads == UnitState::Grads::kOpen,
             "gradient '{}' of unit '{}' used after done(): it is being reduced", name,
             layout_->unit(unit).name);
  const ParamLayout& p = view_param(unit, name, dtype, "gradient");
  return {st.grads_full.as<std::byte>() + p.offset * elem_size(compute_dtype_), p.numel};
}

void* Engine::Impl::unit_grads(int unit) const {
  const UnitState& st = units_[static_cast<size_t>(unit)];
  ZEST_CHECK(st.grads == UnitState::Grads::kOpen,
             "gradients of unit '{}' used after done(): they are being reduced",
             layout_->unit(unit).name);
  return st.grads_full.data();
}

void Engine::Impl::grads_done(int unit) {
  UnitState& st = state(unit);
  const UnitLayout& U = layout_->unit(unit);
  ZEST_CHECK(st.grads == UnitState::Grads::kOpen, "done() of unit '{}' twice in one micro-step",
             U.name);
  st.grads = UnitState::Grads::kDone;
  Impl& im = *this;
  if (im.local_accumulation_) {
    // Note [reduce at the accumulation boundary] (config.h): the
    // micro-steps' gradients are added here, on the compute stream, and only
    // the last micro-step's done() queues a reduction, of their sum.
    const bool last = im.micro_ + 1 == config_.accumulation_steps();
    if (im.micro_ == 0) {
      std::swap(st.grad_acc, st.grads_full);  // the sum so far is this micro-step's; grads() zeroes the other
    } else if (!last) {
      accumulate(stream_, st.grad_acc.data(), st.grads_full.data(), compute_dtype_, U.padded);
    }
    if (!last) return;
    // g_last + sum: the bits of sum + g_last, since a rounded add commutes.
    accumulate(stream_, st.grads_full.data(), st.grad_acc.data(), compute_dtype_, U.padded);
  }
  im.pending_.push_back(unit);
  im.pending_numel_ += U.padded;
  if (static_cast<int64_t>(im.pending_numel_) >= config_.zero.reduce_bucket(im.layout_->padded())) flush_reductions();
}

void Engine::Impl::flush_reductions() {
  Impl& im = *this;
  if (im.pending_.empty()) return;
  const PhaseTimer timer(im.times_.reduce_ms);
  // overlap_comm off: in line with backward on the compute stream, which
  // needs no hand-off.
  const Stream comm = config_.zero.overlap() ? im.comm_queue() : stream_;
  if (comm != stream_) {
    im.handoff_->record(stream_);
    comm.wait(*im.handoff_);
  }

  const bool first_micro = im.micro_ == 0;
  const int stage = config_.zero.stage;
  const bool widening = grad_accum_dtype_ != compute_dtype_;

  // Averaged over the shard group: the replicas' average follows at the
  // accumulation boundary (reduce_across_replicas).
  Communicator& shards = shard_group();
  const GradientDivision division = gradient_division(config_, shards.size());
  if (division.before != 1.0f) {
    for (int u : im.pending_) {
      scale(comm, im.units_[static_cast<size_t>(u)].grads_full.data(), compute_dtype_, division.before,
            im.layout_->unit(u).padded);
    }
  }
  // Under local accumulation the reduced sum stays in grads_full (in place).
  const bool into_acc = !im.local_accumulation_;
  const auto reduced_into = [&](int u) -> void* {
    UnitState& st = im.units_[static_cast<size_t>(u)];
    // The first micro-step reduces straight into an accumulator of the
    // compute dtype; otherwise the reduction is in place, then widened or
    // added into the accumulator.
    return into_acc && st.grad_acc && first_micro && !widening ? st.grad_acc.data() : owned_part(st.grads_full, u);
  };
  // Note [one rank reduces nothing]: over one rank the sum and the average
  // (x / 1) of the gradients are the gradients, bit for bit, so no
  // collective runs: in place that is all, and where the reduction would
  // write the accumulator (the first micro-step's), the two buffers, of one
  // size and dtype at one partition, trade places instead of being copied.
  // (One rank of a shard group: its replicas sum at the boundary.)
  const bool alone = shards.size() == 1;
  if (!alone) shards.group_start();
  for (int u : im.pending_) {
    UnitState& st = im.units_[static_cast<size_t>(u)];
    const UnitLayout& U = im.layout_->unit(u);
    void* dst = reduced_into(u);
    if (alone) {
      if (dst == st.grads_full.data()) continue;
      ZEST_INTERNAL_ASSERT(dst == st.grad_acc.data() && st.grad_acc.size_bytes() == st.grads_full.size_bytes(),
                           "unit {}: one rank's reduction goes to the accumulator, of the gradients' size", u);
      std::swap(st.grad_acc, st.grads_full);
    } else if (stage == 0) {
      shards.all_reduce(st.grads_full.data(), dst, U.padded, compute_dtype_, division.op, comm);
    } else {
      shards.reduce_scatter(st.grads_full.data(), dst, U.shard, compute_dtype_, division.op, comm);
    }
  }
  if (!alone) shards.group_end();
  if (division.after != 1.0f) {
    for (int u : im.pending_) {
      const UnitLayout& U = im.layout_->unit(u);
      scale(comm, reduced_into(u), compute_dtype_, division.after, stage == 0 ? U.padded : U.shard);
    }
  }

  for (int u : im.pending_) {
    UnitState& st = im.units_[static_cast<size_t>(u)];
    const UnitLayout& U = im.layout_->unit(u);
    if (into_acc && st.grad_acc && !first_micro) {
      accumulate(comm, st.grad_acc.data(), grad_accum_dtype_, owned_part(st.grads_full, u), compute_dtype_, U.shard);
    } else if (into_acc && st.grad_acc && widening) {
      convert(comm, owned_part(st.grads_full, u), compute_dtype_, st.grad_acc.data(), grad_accum_dtype_, U.shard);
    }
    if (stage >= 2) {
      // The compute stream may reuse the block only after the comm stream's
      // reads of it.
      allocator_.record_stream(st.grads_full.data(), comm);
      st.grads_full = Buffer();
    }
  }
  im.pending_.clear();
  im.pending_numel_ = 0;
}

// MiCS's step across the groups (Note [MiCS] in config.h), at the
// accumulation boundary: each group's accumulated gradient shards are
// divided by the R replicas and summed over the ranks that hold the same
// shard, as DeepSpeed's MiCS_Optimizer allreduce_mics_shard_grads does (it
// divides by R with div_; the multiplication by 1/R here is the same value
// when R is a power of two, and within half an ulp of it otherwise). Every
// replica then holds the same bits, so the norm summed within the group,
// the overflow decision and the update agree across the world. Ordered on
// the compute stream, after the micro-step's reductions.
void Engine::Impl::reduce_across_replicas() {
  Impl& im = *this;
  Communicator* replicas = im.mics_.replica.get();
  if (replicas == nullptr) return;
  const PhaseTimer timer(im.times_.reduce_ms);
  const ModelLayout& L = *im.layout_;
  const auto inverse = static_cast<float>(1.0 / replicas->size());
  // MiCS runs at stage 3 only, where a trainable unit's reduced gradients
  // are always its accumulator (in grad_accum_dtype).
  for (int u = 0; u < L.num_units(); ++u) {
    UnitState& st = im.units_[static_cast<size_t>(u)];
    ZEST_INTERNAL_ASSERT(L.unit(u).frozen || (st.grad_acc && !im.local_accumulation_),
                         "unit {}: MiCS without a gradient accumulator", u);
    if (!L.unit(u).frozen) scale(stream_, st.grad_acc.data(), grad_accum_dtype_, inverse, L.unit(u).shard);
  }
  replicas->group_start();
  for (int u = 0; u < L.num_units(); ++u) {
    if (L.unit(u).frozen) continue;
    void* g = im.units_[static_cast<size_t>(u)].grad_acc.data();
    replicas->all_reduce(g, g, L.unit(u).shard, grad_accum_dtype_, ReduceOp::kSum, stream_);
  }
  replicas->group_end();
}

// --- GradHandle ---

GradHandle::GradHandle(GradHandle&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)),
      alive_(std::move(other.alive_)),
      unit_(other.unit_) {}

GradHandle& GradHandle::operator=(GradHandle&& other) noexcept {
  engine_ = std::exchange(other.engine_, nullptr);
  alive_ = std::move(other.alive_);
  unit_ = other.unit_;
  return *this;
}

Engine& GradHandle::engine(const char* what) const {
  ZEST_CHECK(engine_ != nullptr, "{} on an empty GradHandle", what);
  ZEST_CHECK(!alive_.expired(),
             "{} on the GradHandle of unit {}, whose Engine has been destroyed; a handle must "
             "not outlive its engine",
             what, unit_);
  return *engine_;
}

detail::UntypedSpan<void> GradHandle::typed_grad(const std::string& name, DType dtype) const {
  return engine(fmt::format("gradient '{}'", name).c_str()).impl_->grad_view(unit_, name, dtype);
}

void* GradHandle::grad_data(const std::string& name) const {
  return typed_grad(name, engine("grad_data()").compute_dtype()).data;
}

void* GradHandle::data() const { return engine("data()").impl_->unit_grads(unit_); }

void GradHandle::done() { engine("done()").impl_->grads_done(unit_); }

}  // namespace zest
