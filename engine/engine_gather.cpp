// gather() and release: parameters for forward and backward. At stages 0-2
// (and for persistent units at stage 3) the full parameters are always
// there and a handle only counts its use; at stage 3 a unit is all-gathered
// from the shards on the communication stream, the units that followed it
// on the first iteration are prefetched while the caller computes, and a
// released unit the recorded order uses again soon stays gathered (Note
// [stage-3 reuse distance]).
//
// Note [stage-3 reuse distance]. DeepSpeed's stage3_max_reuse_distance, as
// its PartitionedParameterCoordinator (__params_to_release) has it: when the
// last handle of a unit is released after the k-th gather of the optimizer
// step (DeepSpeed's step id, which counts from the micro-step's start: the
// micro-steps' parts of the recorded order lie one after another), the
// recorded order is scanned from position k, adding up the parameters (elements,
// without padding; persistent units too) of the units it passes, and the
// unit stays gathered if it appears before that sum reaches the distance,
// checked before each unit (so 0 keeps nothing, and 1 keeps a unit that is
// next in the order). The scan ends with the micro-step, as DeepSpeed's
// trace is one forward and backward: so every unit is released at its last
// use in a micro-step, and end_micro_step() drops whatever is left (unused
// prefetches) before the optimizer step changes the parameters, as
// DeepSpeed's step() partitions every parameter before it updates. While
// the order is being recorded, and after the loop strayed from it, units
// are released with their handles (DeepSpeed: trace not complete). A kept
// unit counts in live_numel, so prefetching (bounded by
// stage3_max_live_parameters) sees it, as DeepSpeed's available-parameter
// count does. Persistent units are never released, as ever. DeepSpeed's
// other rule, keeping a parameter whose later use a prefetch skipped, never
// applies here: prefetch_after() stops at a gathered unit instead of
// skipping it.
//
// Note [a gather order per kind of pass]. DeepSpeed keeps two parameter
// coordinators, each with its own trace: one for training and one for
// evaluation (get_param_coordinator, chosen by module.training), and a
// forward run with grad off ends in its coordinator's reset_step (the
// end-of-forward hook). So an evaluation pass between steps neither breaks
// training's trace (which would pause its prefetching for an iteration) nor
// leaves a unit gathered after it: its trace is one forward, and the reuse
// distance finds nothing after the forward's last unit. The engine keeps an
// order per Pass likewise, each gather naming its pass. TorchModule names
// kInference for a unit's forward under torch's no-grad mode, the run that
// DeepSpeed's hook ends, since a libtorch module has no forward hook of its
// own to end it with. A gather of Pass::kNone, which reads parameters
// outside forward and backward as DeepSpeed's GatheredParameters does
// outside its coordinators (TorchModule::read), follows no order and keeps
// nothing. An inference pass ends at end_forward() (reset_step) or, without
// one, at the next training gather, so a validation loop of several
// forwards between two steps is one pass, replayed as one by the next. Its
// end releases what it gathered and no handle holds (units kept for a
// reuse that did not come, unused prefetches). Recording, replaying,
// keeping and straying are as for training, with the pass for the
// micro-step. A generation loop that never calls end_forward() would record
// without end: past kInferenceOrderLimit gathers its recording stops, and
// its units go with their handles until a pass ends.
#include <algorithm>
#include <optional>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/memory/copy.h"

namespace zest {
namespace {

// Note [a gather order per kind of pass]: the longest inference order
// recorded without a pass's end (256 KiB of unit numbers).
constexpr size_t kInferenceOrderLimit = size_t{1} << 16;

// A stage-3 gather's collective tag (CollectiveDesc::tag): its unit, so that
// ranks gathering different units of one size fail as diverged instead of
// exchanging the wrong unit's shards.
uint64_t gather_tag(int unit) { return static_cast<uint64_t>(unit) + 1; }

// The units behind the tags a divergence message quotes ("..., tag 3)").
std::string tag_legend(std::string_view message, const ModelLayout& layout) {
  std::string legend;
  std::vector<int> seen;
  for (size_t at = message.find("tag "); at != std::string_view::npos;
       at = message.find("tag ", at + 4)) {
    int unit = 0;
    size_t i = at + 4;
    bool digits = false;
    while (i < message.size() && message[i] >= '0' && message[i] <= '9' && unit < (1 << 24)) {
      unit = unit * 10 + (message[i++] - '0');
      digits = true;
    }
    --unit;
    if (!digits || unit < 0 || unit >= layout.num_units() ||
        std::find(seen.begin(), seen.end(), unit) != seen.end()) {
      continue;
    }
    seen.push_back(unit);
    legend += fmt::format("{}tag {} is unit '{}'", legend.empty() ? "" : ", ", unit + 1,
                          layout.unit(unit).name);
  }
  return legend;
}

// A gather's mismatch, met where it was issued or, on the host's
// communication thread, where its unit was waited for: with the units the
// ranks' tags name.
[[noreturn]] void rethrow_named(const CommError& e, const ModelLayout& layout) {
  if (e.reason() != CommError::Reason::kMismatch) throw;
  throw CommError(e.reason(),
                  fmt::format("stage 3: the ranks gathered different units ({}): {} Every rank "
                              "must gather the same units in the same order",
                              tag_legend(e.message(), layout), e.message()),
                  e.file(), e.line());
}

}  // namespace

// Queues the all-gather of a non-resident unit into a new full buffer.
void Engine::Impl::materialize(int unit) {
  Impl& im = *this;
  UnitState& st = im.units_[static_cast<size_t>(unit)];
  const UnitLayout& U = im.layout_->unit(unit);
  const PhaseTimer timer(im.times_.gather_ms);
  const size_t bytes = U.padded * elem_size(compute_dtype_);
  // Allocated on the compute stream, which frees it; the comm stream writes
  // it only after everything queued on the compute stream so far.
  st.params_full = allocator_.allocate_buffer(bytes, stream_, MemoryCategory::kParameters);
  allocator_.record_stream(st.params_full.data(), im.comm_queue());
  im.handoff_->record(stream_);
  im.comm_queue().wait(*im.handoff_);
  // An offloaded shard comes to the device first, into this rank's slot of
  // the full buffer, which the all-gather then reads in place; from a swap
  // file, through a buffer of its pool (read ahead by the prefetcher, or
  // now), which is the pool's again once the copy is done.
  const void* shard = st.params_shard.data();
  if (shard_in_swap(unit)) {
    std::optional<ParamSwap::Held> values;
    try {
      values.emplace(*im.param_swap_, unit);
    } catch (...) {
      st.params_full = Buffer();  // not gathered: the next gather reads again
      throw;
    }
    std::byte* slot = owned_part(st.params_full, unit);
    copy_bytes(im.comm_queue(), slot, values->bytes().data(), values->bytes().size());
    im.comm_queue().synchronize();
    values.reset();
    shard = slot;
  } else if (shard_on_host(unit)) {
    std::byte* slot = owned_part(st.params_full, unit);
    copy_bytes(im.comm_queue(), slot, shard, U.shard * elem_size(compute_dtype_));
    shard = slot;
  }
  const size_t bc = elem_size(compute_dtype_);
  Communicator* hpz = im.mics_.hpz.get();
  try {
    if (hpz != nullptr && st.params_secondary) {
      // hpZ: from the secondary copy, within the group (in place, from this
      // rank's slot of its part).
      const size_t part = U.padded / static_cast<size_t>(hpz->size());
      std::byte* slot = st.params_full.as<std::byte>() + static_cast<size_t>(hpz->rank()) * part * bc;
      copy_bytes(im.comm_queue(), slot, st.params_secondary.data(), part * bc);
      hpz->all_gather(slot, st.params_full.data(), part, compute_dtype_, im.comm_queue(), gather_tag(unit));
    } else {
      shard_group().all_gather(shard, st.params_full.data(), U.shard, compute_dtype_, im.comm_queue(), gather_tag(unit));
      if (hpz != nullptr) {
        // The secondary copy: this rank's part of the unit over its hpZ
        // group, for the gathers until the next optimizer step.
        const size_t part = U.padded / static_cast<size_t>(hpz->size());
        st.params_secondary = allocator_.allocate_buffer(part * bc, stream_, MemoryCategory::kParameters);
        allocator_.record_stream(st.params_secondary.data(), im.comm_queue());
        copy_bytes(im.comm_queue(), st.params_secondary.data(),
                   st.params_full.as<std::byte>() + static_cast<size_t>(hpz->rank()) * part * bc, part * bc);
      }
    }
  } catch (const CommError& e) {
    rethrow_named(e, *im.layout_);
  }
  st.ready->record(im.comm_queue());
  im.live_numel_ += U.padded;
}

void Engine::Impl::drop(int unit) {
  Impl& im = *this;
  UnitState& st = im.units_[static_cast<size_t>(unit)];
  if (st.resident || !st.params_full) return;
  st.params_full = Buffer();
  im.live_numel_ -= im.layout_->unit(unit).padded;
}

// Gathers the units that come next in the recorded order, up to
// stage3_prefetch_bucket_size elements ahead, while the gathered units (the
// kept ones too) stay under stage3_max_live_parameters, not past a unit
// that is already gathered, and not past the micro-step's (or inference
// pass's) end, which would drop them unused.
void Engine::Impl::prefetch_after(size_t pos) {
  Impl& im = *this;
  const RecordedOrder& order = im.order();
  size_t ahead = 0;
  const size_t end = pass_part_end();
  // The reads of the units about to be gathered go out together, so that
  // the drive works on them at once rather than one gather after another.
  if (im.param_swap_) read_ahead(pos, end);
  for (size_t i = pos; i < end; ++i) {
    const int v = order.units[i];
    UnitState& st = im.units_[static_cast<size_t>(v)];
    if (st.resident) continue;
    // A unit already there is where an earlier prefetch stopped, the one in
    // use, or one kept for its reuse: what lies beyond it is prefetched
    // when the order reaches it.
    if (st.params_full) break;
    const size_t n = im.layout_->unit(v).padded;
    ahead += n;
    if (static_cast<int64_t>(ahead) > config_.zero.stage3_prefetch_bucket_size) break;
    if (static_cast<int64_t>(im.live_numel_ + n) > config_.zero.stage3_max_live_parameters) break;
    materialize(v);
  }
  if (im.param_swap_) read_ahead(pos, end);
}

// offload_param nvme: the shards in the swap file of the units next in the
// recorded order that are not gathered yet, read into the pool's free
// buffers (at most buffer_count reads at once, DeepSpeed's bound), so that
// their gathers (the prefetch's, or the caller's past the prefetch window)
// find them in host memory or on their way.
void Engine::Impl::read_ahead(size_t pos, size_t end) {
  Impl& im = *this;
  const RecordedOrder& order = im.order();
  int started = 0;
  for (size_t i = pos; i < end && started < im.param_swap_->buffer_count(); ++i) {
    const int v = order.units[i];
    if (!shard_in_swap(v) || im.units_[static_cast<size_t>(v)].params_full) continue;
    if (!im.param_swap_->start_read(v)) break;
    ++started;
  }
}

// Note [a gather order per kind of pass]: a training gather ends an
// inference pass.
void Engine::Impl::enter_pass(Pass pass) {
  Impl& im = *this;
  if (pass == Pass::kInference) {
    im.inference_open_ = true;
  } else if (im.inference_open_) {
    end_inference_pass();
  }
  im.pass_ = pass;
}

void Engine::Impl::end_inference_pass() {
  Impl& im = *this;
  im.inference_open_ = false;
  im.orders_[static_cast<int>(Pass::kInference)].end_pass();
  drop_unheld();
}

void Engine::Impl::drop_unheld() {
  for (int u = 0; u < layout_->num_units(); ++u) {
    if (units_[static_cast<size_t>(u)].gathered == 0) drop(u);
  }
}

void Engine::Impl::end_forward() {
  check_finalized("end_forward()");
  if (inference_open_) end_inference_pass();
}

void Engine::Impl::follow_trace(int unit) {
  Impl& im = *this;
  RecordedOrder& order = im.order();
  const bool inference = im.pass_ == Pass::kInference;
  if (!order.valid) return;
  if (order.recording) {
    if (!inference || order.units.size() < kInferenceOrderLimit) {
      order.units.push_back(unit);
      return;
    }
    order.valid = false;
    order.units = {};
    if (std::exchange(order.warned, true)) return;
    ZEST_LOG_INFO("stage 3: {} inference gathers without an end_forward() or a training gather: the inference "
                  "order is not recorded (no prefetching; each unit is released with its handle) until a pass "
                  "ends; call engine.end_forward() after each forward that has no backward",
                  kInferenceOrderLimit);
    return;
  }
  if (order.pos < order.units.size() && order.units[order.pos] == unit) {
    ++order.pos;
    prefetch_after(order.pos);
    return;
  }
  order.valid = false;
  // Once per engine and order: an order that keeps changing would otherwise
  // log every iteration.
  if (std::exchange(order.warned, true)) return;
  // Benign (a loop whose passes differ does it), hence info.
  ZEST_LOG_INFO("stage 3: {} gather #{} is unit '{}', not '{}' as in the recorded order; prefetching pauses until "
                "the order is recorded again over the next {}",
                inference ? "inference" : "training", order.pos + 1, im.layout_->unit(unit).name,
                order.pos < order.units.size() ? im.layout_->unit(order.units[order.pos]).name : "none",
                inference ? "inference pass" : "iteration");
}

UnitHandle Engine::Impl::gather(int unit, Pass pass) {
  UnitState& st = state(unit);
  // An evaluation between steps is not the step's work (its throughput).
  if (pass == Pass::kTraining) start_step_clock();
  // Persistent units are in the order too: DeepSpeed's trace holds every
  // module, and their parameters count in the reuse distance.
  const bool ordered = config_.zero.stage == 3 && pass != Pass::kNone;
  if (ordered) enter_pass(pass);
  if (!st.resident) {
    const bool fresh = !st.params_full;
    if (fresh) materialize(unit);
    if (ordered) follow_trace(unit);
    const PhaseTimer timer(times_.gather_ms);
    try {
      stream_.wait(*st.ready);
    } catch (const CommError& e) {
      rethrow_named(e, *layout_);
    }
  } else if (ordered) {
    follow_trace(unit);
  }
  ++st.gathered;
  st.last_pass = pass;
  return UnitHandle(&self_, lifetime_.watch(), unit);
}

// Where this micro-step's part of the recorded order ends (an inference
// pass is one part).
size_t Engine::Impl::pass_part_end() const {
  const RecordedOrder& o = order();
  const auto end = std::lower_bound(o.ends.begin(), o.ends.end(), o.pos);
  return end == o.ends.end() ? o.units.size() : *end;
}

// Note [stage-3 reuse distance].
bool Engine::Impl::reused_soon(int unit) const {
  const Impl& im = *this;
  const RecordedOrder& order = im.order();
  const int64_t distance = config_.zero.stage3_max_reuse_distance;
  if (distance <= 0 || order.recording || !order.valid) return false;
  const size_t end = pass_part_end();
  int64_t traversed = 0;
  for (size_t i = order.pos; i < end; ++i) {
    if (traversed >= distance) break;
    if (order.units[i] == unit) return true;
    traversed += static_cast<int64_t>(im.layout_->unit(order.units[i]).numel);
  }
  return false;
}

void Engine::Impl::release(int unit) {
  UnitState& st = units_[static_cast<size_t>(unit)];
  ZEST_INTERNAL_ASSERT(st.gathered > 0, "release of unit {} that is not gathered", unit);
  if (--st.gathered == 0 && !st.resident && (st.last_pass == Pass::kNone || !reused_soon(unit))) drop(unit);
}

const ParamLayout& Engine::Impl::view_param(int unit, const std::string& name, DType dtype,
                                      const char* what) const {
  const ParamRef ref = layout_->find(name);
  const UnitLayout& U = layout_->unit(unit);
  ZEST_CHECK(ref.unit == unit, "parameter '{}' belongs to unit '{}', not to unit '{}'", name,
             layout_->unit(ref.unit).name, U.name);
  ZEST_CHECK(dtype == compute_dtype_, "{} '{}' is {}, not {}: views use the compute dtype", what,
             name, dtype_name(compute_dtype_), dtype_name(dtype));
  return layout_->param(ref);
}

detail::UntypedSpan<const void> Engine::Impl::param_view(int unit, const std::string& name,
                                                   DType dtype) const {
  const ParamLayout& p = view_param(unit, name, dtype, "parameter");
  return {units_[static_cast<size_t>(unit)].params_full.as<std::byte>() +
              p.offset * elem_size(compute_dtype_),
          p.numel};
}

const void* Engine::Impl::unit_params(int unit) const {
  return units_[static_cast<size_t>(unit)].params_full.data();
}

// --- UnitHandle ---

UnitHandle::~UnitHandle() { release(); }

UnitHandle::UnitHandle(UnitHandle&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)),
      alive_(std::move(other.alive_)),
      unit_(other.unit_) {}

UnitHandle& UnitHandle::operator=(UnitHandle&& other) noexcept {
  if (this != &other) {
    release();
    engine_ = std::exchange(other.engine_, nullptr);
    alive_ = std::move(other.alive_);
    unit_ = other.unit_;
  }
  return *this;
}

void UnitHandle::release() {
  Engine* engine = std::exchange(engine_, nullptr);
  // An engine already destroyed has nothing left to give back to.
  if (engine != nullptr && !alive_.expired()) engine->impl_->release(unit_);
  alive_.reset();
}

Engine& UnitHandle::engine(const char* what) const {
  ZEST_CHECK(engine_ != nullptr, "{} through an empty or released UnitHandle", what);
  ZEST_CHECK(!alive_.expired(),
             "{} through the UnitHandle of unit {}, whose Engine has been destroyed; a handle "
             "must not outlive its engine",
             what, unit_);
  return *engine_;
}

detail::UntypedSpan<const void> UnitHandle::typed_param(const std::string& name, DType dtype) const {
  return engine(fmt::format("parameter '{}' read", name).c_str()).impl_->param_view(unit_, name, dtype);
}

const void* UnitHandle::data() const {
  ZEST_CHECK(engine_ != nullptr, "data() of a released UnitHandle");
  return engine_->impl_->unit_params(unit_);
}

const void* UnitHandle::param_data(const std::string& name) const {
  return typed_param(name, engine("param_data()").compute_dtype()).data;
}

}  // namespace zest
