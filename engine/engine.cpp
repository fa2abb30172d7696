// Construction, registration, finalize (layout, cross-rank check,
// allocation, initial values) and inspection.
#include "zest/engine/engine.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <utility>

#include "zest/comm/gather_scalars.h"
#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/core/process_memory.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/engine/host_comm_thread.h"
#include "zest/engine/layout_constants.h"
#include "zest/engine/master_precision.h"
#include "zest/engine/detail/shard_groups.h"
#include "zest/memory/copy.h"
#include "zest/optim/grad_ops.h"

namespace zest {
namespace {

// The config as the engine runs it: checked, and with DeepSpeed's batch
// triple resolved at the real data-parallel world size, so that the
// accumulation a file implies (32 / 8 on one rank: 4 micro-steps per
// optimizer step) is the one the engine takes.
EngineConfig checked(EngineConfig c, const Communicator& comm) {
  ZEST_CHECK(c.zero.stage >= 0 && c.zero.stage <= 3,
             "zero_optimization.stage is {}: allowed values are 0, 1, 2 and 3", c.zero.stage);
  const bool offloads_optimizer = c.offload_optimizer.device != OffloadDevice::kNone;
  c.resolve_batch(comm.size());
  check_hierarchical(c.zero, offloads_optimizer,
                     c.offload_param.device != OffloadDevice::kNone, comm.size());
  ZEST_CHECK(!c.zero.reduce_at_accumulation_boundary || c.zero.stage <= 1,
             "zero.reduce_at_accumulation_boundary is on at stage {}: stages 2-3 keep only the owned "
             "shard of the gradients between micro-steps, so they reduce every micro-step; turn it "
             "off or use stage 0 or 1",
             c.zero.stage);
  const DType compute = c.compute_dtype();
  ZEST_CHECK(!c.grad_accum_dtype || *c.grad_accum_dtype == compute || *c.grad_accum_dtype == DType::kFloat32,
             "data_types.grad_accum_dtype is {} with {} compute: ZEST accumulates gradients in the compute dtype "
             "or in fp32; set it to {}, or remove it",
             dtype_name(c.grad_accum_dtype.value_or(compute)), dtype_name(compute),
             compute == DType::kFloat32 ? std::string("\"fp32\"")
                                        : fmt::format("\"fp32\" or \"{}\"", dtype_name(compute)));
  ZEST_CHECK(!c.zero.reduce_at_accumulation_boundary || c.grad_accum_dtype.value_or(compute) == compute,
             "zero.reduce_at_accumulation_boundary with data_types.grad_accum_dtype {} under {} compute: the "
             "local accumulation adds in the compute dtype; turn one of them off",
             dtype_name(c.grad_accum_dtype.value_or(compute)), dtype_name(compute));
  ZEST_CHECK(c.offload_optimizer.device == OffloadDevice::kNone || c.grad_accum_dtype.value_or(compute) == compute,
             "zero_optimization.offload_optimizer with data_types.grad_accum_dtype {} under {} compute is not yet "
             "supported: the host optimizer reads gradients of the compute dtype; remove grad_accum_dtype or the "
             "offload",
             dtype_name(c.grad_accum_dtype.value_or(compute)), dtype_name(compute));
  check_master_precision({compute, c.master_dtype(), c.optimizer_state_dtype(), c.zero.stage,
                          offloads_optimizer, c.optimizer.kind, c.grad_accum_dtype});
  ZEST_CHECK(c.gradient_clipping >= 0.0, "gradient_clipping is {}: it must be >= 0 (0: off)",
             c.gradient_clipping);
  c.optimizer.validate();
  c.scheduler.validate();
  ZEST_CHECK(c.optimizer.kind != OptimizerKind::kLamb || c.offload_optimizer.device == OffloadDevice::kNone,
             "optimizer Lamb with zero_optimization.offload_optimizer is not supported: LAMB's trust "
             "ratios need every parameter's norms before any weight changes, which the host's chunked update "
             "pipeline does not provide (DeepSpeed's offload runs only its CPU Adam too); set "
             "offload_optimizer.device to \"none\", or use the AdamW optimizer");
  if (offloads_optimizer) {
    ZEST_CHECK(c.zero.stage >= 1,
               "zero_optimization.offload_optimizer (device {}) needs ZeRO stage 1, 2 or 3; this config "
               "is stage 0: set zero_optimization.stage, or offload_optimizer.device to \"none\"",
               c.offload_optimizer.device == OffloadDevice::kCpu ? "cpu" : "nvme");
    (void)offloaded_numel(0, c.offload_optimizer.ratio);  // checks the ratio
    ZEST_CHECK(c.offload_optimizer.device != OffloadDevice::kNvme || !c.offload_optimizer.delayed_update,
               "zero_optimization.offload_optimizer.delayed_update with device \"nvme\" is not supported: the delayed "
               "update runs over the whole host part at once, which the swap file's buffer ring streams chunk by "
               "chunk; turn delayed_update off, or use device \"cpu\"");
  }
  if (c.offload_param.device != OffloadDevice::kNone && c.zero.stage == 3) {
    // Note [offload_param runs with the optimizer on the host]. The host
    // optimizer is then the only writer of the offloaded parameter shards,
    // so no device kernel ever reads or writes host memory (which on CUDA
    // would need mapped pinned memory); every real configuration seen that
    // offloads parameters offloads the optimizer too (ZeRO-Infinity's).
    const char* const optimizer = c.offload_optimizer.device == OffloadDevice::kCpu    ? "cpu"
                                  : c.offload_optimizer.device == OffloadDevice::kNvme ? "nvme"
                                                                                       : "none";
    if (c.offload_param.device == OffloadDevice::kNvme) {
      // Note [parameter swap regions] (engine/detail/param_swap.h): a step whose
      // write of the parameters to the drive fails is undone with the
      // optimizer's roll back of the master weights, which only a master on
      // the drive has (its two regions); one in host memory is updated in
      // place, and would be left a step ahead of the parameters.
      ZEST_CHECK(c.offload_optimizer.device == OffloadDevice::kNvme && c.offload_optimizer.ratio >= 1.0,
                 "zero_optimization.offload_param (device nvme) needs offload_optimizer {{\"device\": \"nvme\"}} with "
                 "ratio 1 in ZEST: its host optimizer writes the parameters, and a step that fails to write them to "
                 "the drive is undone with the master weights' previous values, which only the optimizer's swap file "
                 "keeps; this config has offload_optimizer device {}, ratio {}: set offload_optimizer.device to "
                 "\"nvme\" (with its nvme_path), or offload_param.device to \"cpu\"",
                 optimizer, c.offload_optimizer.ratio);
    }
    ZEST_CHECK(carries_offloaded_params(c.offload_optimizer),
               "zero_optimization.offload_param (device cpu) needs offload_optimizer {{\"device\": \"cpu\"}} (or "
               "\"nvme\") with ratio 1 in ZEST, whose host optimizer then writes the offloaded parameters; this config has "
               "offload_optimizer device {}, ratio {}: add offload_optimizer {{\"device\": \"cpu\"}}, or set "
               "offload_param.device to \"none\"",
               optimizer, c.offload_optimizer.ratio);
  }
  return c;
}

// What the config file's keys became, said once, by rank 0: the keys ZEST
// ignores and why, the values "auto" took, and the batch arithmetic.
void log_config_notes(const EngineConfig& c, const Communicator& comm) {
  if (comm.rank() != 0) return;
  auto list = [](const std::vector<ConfigNote>& notes) {
    std::string s;
    for (const ConfigNote& n : notes) s += fmt::format("{}{}: {}", s.empty() ? "" : "; ", n.key, n.text);
    return s;
  };
  if (!c.ignored.empty()) ZEST_LOG_INFO("config: ignored (ZEST does not do what they control): {}", list(c.ignored));
  if (!c.auto_filled.empty()) {
    ZEST_LOG_INFO("config: from the program (\"auto\" and absent sections): {}", list(c.auto_filled));
  }
  if (!c.mismatched.empty()) ZEST_LOG_WARN("config: the file differs from the program's values: {}", list(c.mismatched));
  if (!c.warnings.empty()) ZEST_LOG_WARN("config: {}", list(c.warnings));
  if (const std::string batch = c.batch_summary(comm.size()); !batch.empty()) ZEST_LOG_INFO("config: {}", batch);
}

}  // namespace

int64_t MemoryReport::host_model_states() const {
  return host(MemoryCategory::kParameters).current + host(MemoryCategory::kGradients).current +
         host(MemoryCategory::kMasterWeights).current + host(MemoryCategory::kOptimizerState).current;
}

int64_t MemoryReport::nvme_bytes() const {
  int64_t sum = 0;
  for (const Entry& e : nvme_by_category) sum += e.current;
  return sum;
}

int64_t MemoryReport::model_states() const {
  return (*this)[MemoryCategory::kParameters].current +
         (*this)[MemoryCategory::kGradients].current +
         (*this)[MemoryCategory::kMasterWeights].current +
         (*this)[MemoryCategory::kOptimizerState].current;
}

Engine::Impl::Impl(Engine& self, EngineConfig config, Communicator& comm, CachingAllocator& allocator,
                   CachingAllocator* host_allocator, Stream stream)
    : self_(self),
      config_(checked(std::move(config), comm)),
      comm_(comm),
      allocator_(allocator),
      stream_(stream),
      compute_dtype_(config_.compute_dtype()),
      grad_accum_dtype_(config_.grad_accum_dtype.value_or(compute_dtype_)),
      master_dtype_(config_.master_dtype()),
      state_dtype_(config_.optimizer_state_dtype()),
      comm_alive_(comm.lifetime()),
      allocator_alive_(allocator.lifetime()),
      scaler_(config_.fp16.scaler()) {
  ZEST_CHECK(allocator.device() == comm.device() && stream.device() == comm.device(),
             "engine: the communicator is on {}, the allocator on {} and the stream on {}; they "
             "must be on one device",
             comm.device().str(), allocator.device().str(), stream.device().str());
  // The optimizer and the step's decisions run in the caller's thread on
  // the host (core/stream.h: only some work honours a host stream's own
  // thread), so they would race with work queued on such a stream.
  ZEST_CHECK(stream.host_queue() == nullptr,
             "engine: its stream is a host stream with a thread of its own (HostWork::kOwnThread); the engine "
             "computes in the caller's thread on the host, so give it an inline stream (Stream::default_for, or "
             "OwnedStream with HostWork::kInline); overlap_comm gives its communication a thread of its own");
  if (host_allocator != nullptr) {
    ZEST_CHECK(host_allocator->device().is_host(),
               "engine: the host allocator allocates memory of {}; offloaded state needs host memory "
               "(make_host_allocator, or make_cuda_pinned_allocator on a GPU)",
               host_allocator->device().str());
  }
  groups_.push_back({"default", config_.optimizer.weight_decay});
  log_config_notes(config_, comm);
  if (host_allocator != nullptr) {
    host_allocator_ = host_allocator;
    host_allocator_alive_ = host_allocator->lifetime();
  } else if (config_.offload_optimizer.device != OffloadDevice::kNone) {
    // One host allocator for both offloads: pinned when either asks.
    const bool pinned = (config_.offload_optimizer.pin_memory || (offloads_params() && config_.offload_param.pin_memory)) &&
                        comm.device().is_cuda();
    own_host_allocator_ = std::make_unique<CachingAllocator>(pinned ? make_cuda_pinned_allocator() : make_host_allocator());
    host_allocator_ = own_host_allocator_.get();
  }
  if (config_.offload_param.device != OffloadDevice::kNone && config_.zero.stage < 3 && comm.rank() == 0) {
    ZEST_LOG_INFO("config: offload_param ignored: DeepSpeed offloads parameters only at stage 3; this is stage {}",
                  config_.zero.stage);
  }
}

Engine::Impl::~Impl() {
  // Reductions and gathers still queued read buffers about to be freed.
  if (comm_stream_) {
    try {
      comm_queue().synchronize();
      stream_.synchronize();
    } catch (const std::exception&) {
      ZEST_LOG_WARN("engine teardown: {}", current_exception_text());
    }
  }
}

Engine::Engine(EngineConfig config, Communicator& comm, CachingAllocator& allocator, Stream stream)
    : impl_(std::make_unique<Impl>(*this, std::move(config), comm, allocator, nullptr, stream)) {}

Engine::Engine(EngineConfig config, Communicator& comm, CachingAllocator& allocator,
               CachingAllocator& host_allocator, Stream stream)
    : impl_(std::make_unique<Impl>(*this, std::move(config), comm, allocator, &host_allocator, stream)) {}

Engine::~Engine() = default;

// The interface, forwarded to the state behind it (engine/detail/engine_state.h).
void Engine::add_param_group(const std::string& name, float weight_decay) { impl_->add_param_group(name, weight_decay); }
int Engine::add_unit(const std::string& name, std::vector<ParamSpec> params) { return impl_->add_unit(name, std::move(params)); }
void Engine::set_model_parallel(const ModelParallel& mp) { impl_->set_model_parallel(mp); }
const ModelParallel& Engine::model_parallel() const { return impl_->model_parallel(); }
void Engine::finalize(const Initializer& init, InitFrom from) { impl_->finalize(init, from); }
UnitHandle Engine::gather(int unit, Pass pass) { return impl_->gather(unit, pass); }
void Engine::end_forward() { impl_->end_forward(); }
GradHandle Engine::grads(int unit) { return impl_->grads(unit); }
void Engine::no_grads(int unit) { impl_->no_grads(unit); }
double Engine::loss_scale() const { return impl_->loss_scale(); }
StepResult Engine::step() { return impl_->step(); }
void Engine::set_lr(double lr) { impl_->set_lr(lr); }
void Engine::clear_lr() { impl_->clear_lr(); }
void Engine::set_lr_schedule(LrSchedule schedule) { impl_->set_lr_schedule(std::move(schedule)); }
double Engine::next_lr() const { return impl_->next_lr(); }
void Engine::set_tokens_per_micro_batch(int64_t tokens) { impl_->set_tokens_per_micro_batch(tokens); }
const EngineConfig& Engine::config() const { return impl_->config_; }
int Engine::stage() const { return impl_->stage(); }
DType Engine::compute_dtype() const { return impl_->compute_dtype(); }
DType Engine::grad_accum_dtype() const { return impl_->grad_accum_dtype(); }
DType Engine::master_dtype() const { return impl_->master_dtype(); }
DType Engine::state_dtype() const { return impl_->state_dtype(); }
Stream Engine::stream() const { return impl_->stream(); }
Communicator& Engine::shard_comm() const { return impl_->shard_comm(); }
Communicator* Engine::replica_comm() const { return impl_->replica_comm(); }
Communicator* Engine::hpz_comm() const { return impl_->hpz_comm(); }
std::vector<float> Engine::unit_master(int unit) { return impl_->unit_master(unit); }
std::vector<float> Engine::param_master(const std::string& name) { return impl_->param_master(name); }
MemoryReport Engine::memory_report() const { return impl_->memory_report(); }
bool Engine::persistent(int unit) const { return impl_->persistent(unit); }

Engine::GradState Engine::grad_state(int unit) const {
  impl_->check_finalized("grad_state()");
  ZEST_CHECK(unit >= 0 && unit < impl_->layout_->num_units(), "unit index {} is out of range: {} units are registered",
             unit, impl_->layout_->num_units());
  return impl_->units_[static_cast<size_t>(unit)].grads;
}
Engine::Progress Engine::progress() const { return impl_->progress(); }
int Engine::micro_steps_pending() const { return impl_->micro_steps_pending(); }
int Engine::shard_buffers() const { return impl_->shard_buffers(); }
std::vector<float> Engine::read_shard(int unit, int buffer) { return impl_->read_shard(unit, buffer); }
void Engine::write_shard(int unit, int buffer, std::span<const float> values) { impl_->write_shard(unit, buffer, values); }
void Engine::restore(const Progress& progress) { impl_->restore(progress); }
Engine::ShardLoad Engine::begin_shard_load(int unit, std::optional<DType> every_value) { return impl_->begin_shard_load(unit, every_value); }
void Engine::load_shard(int unit, size_t at, const void* values, DType dtype, size_t n) { impl_->load_shard(unit, at, values, dtype, n); }
void Engine::abandon_shard_load(int unit) { impl_->abandon_shard_load(unit); }
void Engine::finish_shard_load(const Progress& progress) { impl_->finish_shard_load(progress); }
void Engine::widen_deferred_masters() { impl_->widen_deferred_masters(); }
std::vector<int64_t> Engine::all_gather_scalars(std::span<const int64_t> mine) { return impl_->all_gather_scalars(mine); }
int Engine::partition() const { return impl_->partition(); }
const ModelLayout& Engine::layout() const {
  impl_->check_finalized("layout()");
  return *impl_->layout_;
}
Communicator& Engine::comm() const { return impl_->comm_; }

void Engine::Impl::check_borrowed(const char* what) const {
  ZEST_CHECK(!comm_alive_.expired(),
             "{}: the Communicator this Engine was created with has been destroyed; keep the "
             "communicator alive until the engine is destroyed (declare it first)",
             what);
  ZEST_CHECK(!allocator_alive_.expired(),
             "{}: the CachingAllocator this Engine was created with has been destroyed; keep the "
             "allocator alive until the engine is destroyed (declare it first)",
             what);
  ZEST_CHECK(own_host_allocator_ != nullptr || host_allocator_ == nullptr || !host_allocator_alive_.expired(),
             "{}: the host CachingAllocator this Engine was created with has been destroyed; keep it "
             "alive until the engine is destroyed (declare it first)",
             what);
}

void Engine::Impl::check_finalized(const char* what) const {
  check_borrowed(what);
  ZEST_CHECK(layout_ != nullptr, "{}: call finalize() first", what);
}


Engine::Impl::UnitState& Engine::Impl::state(int unit) {
  check_finalized("engine");
  ZEST_CHECK(unit >= 0 && unit < layout_->num_units(),
             "unit index {} is out of range: {} units are registered", unit,
             layout_->num_units());
  return units_[static_cast<size_t>(unit)];
}

void Engine::Impl::add_param_group(const std::string& name, float weight_decay) {
  ZEST_CHECK(layout_ == nullptr,
             "add_param_group('{}') after finalize(): register everything first", name);
  ZEST_CHECK(weight_decay >= 0.0f, "parameter group '{}': weight_decay {} must be >= 0", name,
             weight_decay);
  for (const ParamGroupSpec& g : groups_)
    ZEST_CHECK(g.name != name, "parameter group '{}' declared twice", name);
  groups_.push_back({name, weight_decay});
}

int Engine::Impl::add_unit(const std::string& name, std::vector<ParamSpec> params) {
  ZEST_CHECK(layout_ == nullptr, "add_unit('{}') after finalize(): register every unit first",
             name);
  specs_.push_back({name, std::move(params)});
  return static_cast<int>(specs_.size()) - 1;
}

void Engine::Impl::set_model_parallel(const ModelParallel& mp) {
  check_borrowed("set_model_parallel()");
  ZEST_CHECK(layout_ == nullptr, "set_model_parallel() after finalize(): call it before finalize()");
  ZEST_CHECK(mp.tp_size >= 1 && mp.pp_size >= 1 && mp.tp_rank >= 0 && mp.tp_rank < mp.tp_size &&
                 mp.pp_rank >= 0 && mp.pp_rank < mp.pp_size,
             "set_model_parallel: tp rank {} of {} and pp rank {} of {} are not coordinates of a mesh", mp.tp_rank,
             mp.tp_size, mp.pp_rank, mp.pp_size);
  ZEST_CHECK(mp.size() == 1 || (mp.group != nullptr && mp.group->size() == mp.size()),
             "set_model_parallel: tp {} x pp {} needs the model-parallel group of {} ranks (DeviceMesh::"
             "model_parallel()), but {}",
             mp.tp_size, mp.pp_size, mp.size(),
             mp.group == nullptr ? std::string("none was given") : fmt::format("it has {} ranks", mp.group->size()));
  ZEST_CHECK(mp.group == nullptr || mp.group->device() == comm_.device(),
             "set_model_parallel: the model-parallel group is on {} but the engine's communicator on {}",
             mp.group ? mp.group->device().str() : "", comm_.device().str());
  // Stages 2 and 3 with pp > 1 are allowed, where DeepSpeed's PipelineEngine
  // refuses them: a stage's micro-steps come one backward at a time as with
  // gradient accumulation, which the engine reduces the same way at every
  // stage (tests/torch/test_pipeline_stage.cpp: dp x pp at stages 0-3 has the
  // bits of dp alone). They cost a reduction per micro-batch where stages
  // 0-1 can reduce once per batch (reduce_at_boundary).
  ZEST_CHECK(mp.tp_size == 1 || config_.optimizer.kind != OptimizerKind::kLamb,
             "LAMB with tensor parallelism (tp {}) is refused: its per-parameter trust ratios need the norm of "
             "each whole parameter, and a tp rank holds a slice; use AdamW, Adam or SGD, or tp 1",
             mp.tp_size);
  mp_ = mp;
  if (mp.size() == 1) mp_.group = nullptr;
}

const ModelParallel& Engine::Impl::model_parallel() const { return mp_; }

namespace {

// What every rank must agree on beyond the model: what changes the
// arithmetic of a step. A rank with another learning rate or clipping would
// otherwise train a model of its own, silently (the shards simply diverge).
// Values print in their shortest exact form, so any difference shows.
std::string describe_hyperparameters(const EngineConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  const LrScheduleConfig& s = c.scheduler;
  const Fp16Config& f = c.fp16;
  std::string out;
  out += fmt::format("config stage {} compute {} gradient_accumulation_steps {} grad_accum_dtype {} "
                     "gradient_clipping {}\n",
                     c.zero.stage, dtype_name(c.compute_dtype()), c.accumulation_steps(),
                     dtype_name(c.grad_accum_dtype.value_or(c.compute_dtype())), c.gradient_clipping);
  out += fmt::format("config master weights {} optimizer state {}\n", dtype_name(c.master_dtype()),
                     dtype_name(c.optimizer_state_dtype()));
  // Ranks that disagree would wait in different reductions.
  out += fmt::format("config reduce_at_accumulation_boundary {}\n", c.zero.reduce_at_accumulation_boundary);
  out += fmt::format("config prescale_gradients {} gradient_predivide_factor {}\n", c.prescale_gradients,
                     c.gradient_predivide_factor);
  out += fmt::format("config optimizer {} lr {} weight_decay {} betas [{}, {}] eps {} "
                     "bias_correction {} momentum {} dampening {} nesterov {} max_coeff {} min_coeff {} "
                     "eps_inside_sqrt {}\n",
                     optimizer_name(o.kind), o.lr, o.weight_decay, o.beta1, o.beta2, o.eps,
                     o.bias_correction, o.momentum, o.dampening, o.nesterov, o.max_coeff, o.min_coeff,
                     o.eps_inside_sqrt);
  out += fmt::format("config scheduler {} warmup_min_lr {} warmup_max_lr {} warmup_num_steps {} "
                     "warmup_type {} total_num_steps {} warmup_min_ratio {} cos_min_ratio {}\n",
                     static_cast<int>(s.kind), s.warmup_min_lr, s.warmup_max_lr, s.warmup_num_steps,
                     static_cast<int>(s.warmup_type), s.total_num_steps, s.warmup_min_ratio,
                     s.cos_min_ratio);
  out += fmt::format("config fp16 {} loss_scale {} initial_scale_power {} loss_scale_window {} "
                     "hysteresis {} consecutive_hysteresis {} min_loss_scale {}\n",
                     f.enabled, f.loss_scale, f.initial_scale_power, f.loss_scale_window,
                     f.hysteresis, f.consecutive_hysteresis, f.min_loss_scale);
  return out;
}

uint64_t fnv1a(std::string_view text) {
  uint64_t h = 1469598103934665603ull;
  for (const char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// Every rank must lay out the same model with the same hyper-parameters:
// compare digests, and on a difference the full descriptions, so the error
// names what differs.
void check_same_model(Communicator& control, const std::string& text, CachingAllocator& alloc,
                      const Stream& stream) {
  const int world = control.size();
  if (world == 1) return;
  const size_t w = static_cast<size_t>(world);
  // The digests' bits, moved as int64.
  const int64_t mine = static_cast<int64_t>(fnv1a(text));
  const std::vector<int64_t> all = all_gather_int64(control, alloc, stream, std::span(&mine, 1));
  bool same = true;
  for (int64_t d : all) same = same && d == all[0];
  if (same) return;

  // Pad every description to the longest (lengths agreed by a max-reduce).
  Buffer len = alloc.allocate_buffer(16, stream, MemoryCategory::kCommBuffers);
  const int64_t my_len = static_cast<int64_t>(text.size());
  copy_bytes(stream, len.data(), &my_len, 8);
  control.all_reduce(len.data(), len.as<int64_t>() + 1, 1, DType::kInt64, ReduceOp::kMax, stream);
  int64_t max_len = 0;
  copy_bytes(stream, &max_len, len.as<int64_t>() + 1, 8);
  stream.synchronize();
  const size_t n = static_cast<size_t>(max_len);
  std::vector<char> padded(n, '\0');
  std::memcpy(padded.data(), text.data(), text.size());
  Buffer texts = alloc.allocate_buffer(n * (w + 1), stream, MemoryCategory::kCommBuffers);
  copy_bytes(stream, texts.as<char>() + n * w, padded.data(), n);
  control.all_gather(texts.as<char>() + n * w, texts.data(), n, DType::kUInt8, stream);
  std::vector<char> everything(n * w);
  copy_bytes(stream, everything.data(), texts.data(), n * w);
  stream.synchronize();
  const auto text_of = [&](size_t r) { return std::string(everything.data() + r * n, strnlen(everything.data() + r * n, n)); };
  for (size_t r = 1; r < w; ++r) {
    if (all[r] == all[0]) continue;
    ZEST_FAIL(
        "ranks registered different models or configurations: rank 0 and rank {} differ at {} "
        "(rank 0's first). Every rank must add the same groups, units and parameters in the "
        "same order, with the same configuration (optimizer, learning rate schedule, clipping, "
        "loss scaling)",
        r, first_difference(text_of(0), text_of(r)));
  }
}

}  // namespace

// offload_param nvme (engine/detail/param_swap.h): the units gathered on demand
// whose shards max_in_cpu leaves out of host memory, in a swap file. Refuses
// a shard larger than offload_param.buffer_size by name, as DeepSpeed's
// swapper asserts it.
void Engine::Impl::make_param_swap() {
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  const OffloadParamConfig& c = config_.offload_param;
  if (!offloads_params() || c.device != OffloadDevice::kNvme) return;
  std::vector<size_t> in_file(static_cast<size_t>(L.num_units()), 0);
  size_t in_cpu = 0;
  bool any = false;
  for (int u = 0; u < L.num_units(); ++u) {
    if (im.units_[static_cast<size_t>(u)].resident) continue;
    const UnitLayout& U = L.unit(u);
    // DeepSpeed's flat CPU buffer of the optimizer's parameter groups: the
    // first trainable shards while they add up to at most max_in_cpu; the
    // sum goes on over the units on NVMe, so every unit after the first
    // that does not fit is on NVMe too. Frozen units are in no optimizer
    // group: they stay on NVMe, where DeepSpeed's partitioning put them.
    if (!U.frozen) {
      in_cpu += U.shard;
      if (static_cast<int64_t>(in_cpu) <= c.max_in_cpu) continue;
    }
    ZEST_CHECK(static_cast<int64_t>(U.shard) <= c.buffer_size,
               "zero_optimization.offload_param.buffer_size is {} elements, but unit '{}' keeps a shard of {} "
               "elements on NVMe, which must fit one buffer (DeepSpeed asserts the same); set buffer_size to at "
               "least {}, or raise max_in_cpu to keep the unit in host memory",
               c.buffer_size, U.name, U.shard, U.shard);
    in_file[static_cast<size_t>(u)] = U.shard;
    any = true;
  }
  if (!any) return;
  im.param_swap_ = std::make_unique<ParamSwap>(
      ParamSwapConfig{c.nvme_path, static_cast<int>(c.buffer_count), static_cast<size_t>(c.buffer_size),
                      comm_.rank(), compute_dtype_, config_.aio},
      *host_allocator_, std::move(in_file));
}

void Engine::Impl::finalize(const Initializer& init, InitFrom from) {
  check_borrowed("finalize()");
  ZEST_CHECK(layout_ == nullptr, "finalize() called twice");
  ZEST_CHECK(static_cast<bool>(init) || from == InitFrom::kZeros, "finalize(): the initializer is empty");
  // A file's AutoTP size is the program's to build: DeepSpeed would split
  // the model itself, so a run that did not would silently train something
  // else. (pipeline.stages DeepSpeed never reads: PipelineModule's
  // num_stages decides; so neither does this.)
  ZEST_CHECK(config_.tensor_parallel_size == 1 || config_.tensor_parallel_size == mp_.tp_size,
             "the configuration asks for tensor parallelism of {} (tensor_parallel.autotp_size) but the engine's tp "
             "size is {}: build a DeviceMesh with tp {} and pass mesh.engine_model_parallel() to "
             "set_model_parallel() before finalize(), or drop the key",
             config_.tensor_parallel_size, mp_.tp_size, config_.tensor_parallel_size);
  Impl& im = *this;
  const int stage = config_.zero.stage;
  // Every rank splits the same communicators in the same order: the MiCS
  // groups (none under flat sharding), then the scalars' own.
  im.mics_ = split_shard_groups(comm_, config_.zero.shard_group_size(comm_.size()),
                               config_.zero.hpz_group_size(comm_.size()));
  const Communicator& shards = shard_group();
  im.part_ = stage == 0 ? 0 : shards.rank();
  const int partitions = partitions_for(stage, shards.size());
  auto layout = std::make_unique<ModelLayout>(im.groups_, im.specs_, partitions);

  // Scalars only (digests, the norm's words): on NCCL the child shares the
  // parent's connections and buffers rather than setting up its own.
  im.control_ = comm_.split(0, comm_.rank(), /*share_resources=*/true);
  if (im.mics_.shard) im.mics_control_ = im.mics_.shard->split(0, im.mics_.shard->rank(), /*share_resources=*/true);
  im.handoff_.emplace(comm_.device());
  check_same_model(*im.control_, layout->describe() + describe_hyperparameters(config_), allocator_,
                   stream_);
  // Note [the host's communication thread] (host_comm_thread.cpp).
  const bool comm_thread = use_host_comm_thread(config_, comm_, *im.control_, allocator_, stream_);
  im.comm_stream_.emplace(comm_.device(), comm_thread ? HostWork::kOwnThread : HostWork::kInline);
  im.layout_ = std::move(layout);
  const ModelLayout& L = *im.layout_;
  if (im.mp_.tp_rank != 0) find_tp_duplicates();

  const size_t bc = elem_size(compute_dtype_);
  const bool accumulating = config_.accumulation_steps() > 1;
  im.local_accumulation_ = accumulating && config_.zero.reduce_at_accumulation_boundary;
  // The trainable units' shards, in order (frozen units have no master or
  // optimizer state): their first host_numel elements are offloaded.
  if (config_.offload_optimizer.device != OffloadDevice::kNone) {
    im.host_numel_ = offloaded_numel(L.trainable_owned(), config_.offload_optimizer.ratio);
  }
  const size_t on_device = L.trainable_owned() - im.host_numel_;
  if (!master_is_params() && on_device > 0) {
    im.master_ = allocator_.allocate_buffer(on_device * elem_size(master_dtype_), stream_,
                                           MemoryCategory::kMasterWeights);
  }
  for (int s = 0; s < config_.optimizer.state_buffers() && on_device > 0; ++s) {
    const size_t bytes = on_device * elem_size(state_dtype_);
    im.state_[s] = allocator_.allocate_buffer(bytes, stream_, MemoryCategory::kOptimizerState);
    fill_zero(stream_, im.state_[s].data(), bytes);
  }
  if (im.host_numel_ > 0) {
    std::optional<OffloadSwapConfig> swap;
    if (config_.offload_optimizer.device == OffloadDevice::kNvme) {
      swap = OffloadSwapConfig{config_.offload_optimizer.nvme_path,
                               static_cast<int>(config_.offload_optimizer.buffer_count), comm_.rank(), config_.aio,
                               nullptr};
    }
    im.offload_ = std::make_unique<OptimizerOffload>(
        *host_allocator_, comm_.device(), im.host_numel_, config_.optimizer.state_buffers(),
        OffloadDtypes{compute_dtype_, master_dtype_, state_dtype_}, config_.offload_optimizer.delayed_update,
        swap ? &*swap : nullptr);
  }

  im.units_.resize(static_cast<size_t>(L.num_units()));
  for (int u = 0; u < L.num_units(); ++u) {
    im.units_[static_cast<size_t>(u)].resident = resident_unit(stage, partitions, offloads_params(), L.unit(u).numel,
                                                              config_.zero.stage3_param_persistence_threshold);
  }
  make_param_swap();
  Buffer staging;
  std::vector<float> host;
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitLayout& unit = L.unit(u);
    UnitState& st = im.units_[static_cast<size_t>(u)];
    st.ready.emplace(comm_.device());
    if (st.resident) {
      st.params_full = allocator_.allocate_buffer(unit.padded * bc, stream_, MemoryCategory::kParameters);
    } else if (shard_in_swap(u)) {
      // No address: its values are written to the swap file below.
    } else if (shard_on_host(u)) {
      st.params_shard = host_allocator_->allocate_buffer(unit.shard * bc, Stream::default_for(Device::host()),
                                                         MemoryCategory::kParameters);
    } else {
      st.params_shard = allocator_.allocate_buffer(unit.shard * bc, stream_, MemoryCategory::kParameters);
    }
    if (stage < 2 && !unit.frozen) {
      st.grads_full = allocator_.allocate_buffer(unit.padded * bc, stream_, MemoryCategory::kGradients);
    }
    if ((stage >= 2 || accumulating) && !unit.frozen) {
      // Local accumulation adds whole unreduced gradients (in the compute
      // dtype, which grad_accum_dtype then is); otherwise the accumulator
      // holds reduced owned shards, in grad_accum_dtype.
      const size_t numel = im.local_accumulation_ ? unit.padded : unit.shard;
      st.grad_acc = allocator_.allocate_buffer(numel * elem_size(grad_accum_dtype_), stream_, MemoryCategory::kGradients);
    }
    const size_t shard_begin = unit.shard * static_cast<size_t>(im.part_);
    st.host_numel = unit.frozen ? 0
                                : std::min(unit.shard, im.host_numel_ - std::min(im.host_numel_, L.trainable_offset(u)));
    std::array<ShardPiece, 2> masters{};  // a frozen unit has none
    if (!unit.frozen) {
      st.runs = L.shard_runs(u, im.part_);
      masters = shard_pieces(u, 0);
    }

    // Initial values: the initializer fills fp32 values on the host; they
    // reach the device through a staging buffer of at most
    // kInitStagingNumel elements (so a huge unit does not need its fp32 copy
    // on the device), and rank 0's are broadcast. Only the ranks that run
    // the initializer hold the unit in host memory: with values from rank 0,
    // the other ranks of a node would otherwise each hold a copy they never
    // read. With kZeros nothing is filled or sent: the staging is zeroed.
    const bool fills = from == InitFrom::kEveryRank || (from == InitFrom::kRank0 && comm_.rank() == 0);
    if (fills) {
      host.assign(unit.padded, 0.0f);
      for (const ParamLayout& p : unit.params) init(p, std::span<float>(host.data() + p.offset, p.numel));
    }
    const size_t piece = std::min(unit.padded, kInitStagingNumel);
    // With offload_param, a compute-dtype piece after the fp32 one: values
    // are narrowed on the device, then copied to the host shard.
    staging = allocator_.allocate_buffer(piece * (4 + (offloads_params() ? bc : 0)), stream_,
                                         MemoryCategory::kCommBuffers);
    if (from == InitFrom::kZeros) fill_zero(stream_, staging.data(), piece * 4);
    std::byte* full = st.resident ? st.params_full.as<std::byte>() : nullptr;
    for (size_t begin = 0; begin < unit.padded; begin += piece) {
      const size_t n = std::min(piece, unit.padded - begin);
      if (fills) copy_bytes(stream_, staging.data(), host.data() + begin, n * 4);
      if (from == InitFrom::kRank0 && comm_.size() > 1) {
        im.control_->broadcast(staging.data(), staging.data(), n, DType::kFloat32, 0, stream_);
      }
      if (full != nullptr) convert(stream_, staging.data(), DType::kFloat32, full + begin * bc, compute_dtype_, n);
      // The part of this piece in the owned shard.
      const size_t lo = std::max(begin, shard_begin);
      const size_t hi = std::min(begin + n, shard_begin + unit.shard);
      if (lo < hi) {
        const float* src = staging.as<float>() + (lo - begin);
        if (full == nullptr) narrow_into_shard(u, src, lo - shard_begin, hi - lo, staging.as<std::byte>() + piece * 4);
        for (const ShardPiece& m : masters) {
          if (master_is_params() && !m.host) continue;  // the master is the parameters
          const size_t a = std::max(lo - shard_begin, m.begin);
          const size_t b = std::min(hi - shard_begin, m.end);
          if (a >= b) continue;
          std::vector<std::byte> staged_master;
          const ShardPiece s = staged(u, 0, m, a, b, staged_master, /*read=*/false);
          piece_from_fp32(s, a, b, src + (a + shard_begin - lo), /*src_host=*/false);
          unstage(u, 0, m, s);
        }
      }
    }
    if (param_swap_) param_swap_->flush();
    stream_.synchronize();  // `host` is reused for the next unit
    staging = Buffer();
  }
  ZEST_LOG_DEBUG("engine: stage {}, {} units, {} parameters ({} with padding), {} owned per rank",
                 stage, L.num_units(), L.numel(), L.padded(), L.owned());
}

double Engine::Impl::loss_scale() const {
  return config_.fp16.enabled ? scaler_.scale() : 1.0;
}

bool Engine::Impl::persistent(int unit) const {
  check_finalized("persistent()");
  ZEST_CHECK(unit >= 0 && unit < layout_->num_units(),
             "unit index {} is out of range: {} units are registered", unit, layout_->num_units());
  return units_[static_cast<size_t>(unit)].resident;
}

Engine::Progress Engine::Impl::progress() const {
  return {applied_, skipped_, scaler_.state(), lr_override_};
}

std::vector<int64_t> Engine::Impl::all_gather_scalars(std::span<const int64_t> mine) {
  check_finalized("all_gather_scalars()");
  return all_gather_int64(*control_, allocator_, stream_, mine);
}

Communicator& Engine::Impl::shard_group() const { return mics_.shard ? *mics_.shard : comm_; }

Communicator& Engine::Impl::shard_control() const {
  return mics_control_ ? *mics_control_ : *control_;
}

Communicator& Engine::Impl::shard_comm() const {
  check_finalized("shard_comm()");
  return shard_group();
}

Communicator* Engine::Impl::replica_comm() const {
  check_finalized("replica_comm()");
  return mics_.replica.get();
}

Communicator* Engine::Impl::hpz_comm() const {
  check_finalized("hpz_comm()");
  return mics_.hpz.get();
}

int Engine::Impl::partition() const {
  check_finalized("partition()");
  return part_;
}

int Engine::Impl::micro_steps_pending() const {
  check_finalized("micro_steps_pending()");
  return micro_;
}

MemoryReport Engine::Impl::memory_report() const {
  check_borrowed("memory_report()");
  const AllocatorStats s = allocator_.stats();
  MemoryReport r;
  for (MemoryCategory c : kAllMemoryCategories) {
    r.by_category[category_index(c)] = {s.category_requested(c).current, s.category_requested(c).peak};
  }
  if (layout_ != nullptr) {
    const size_t bc = elem_size(compute_dtype_);
    for (int u = 0; u < layout_->num_units(); ++u) {
      const UnitLayout& U = layout_->unit(u);
      const UnitState& st = units_[static_cast<size_t>(u)];
      if (!U.frozen) continue;
      // The device's bytes only: a shard in host memory is the host's kParameters.
      const size_t shard = shard_on_host(u) ? 0 : U.shard;
      const size_t secondary = st.params_secondary ? U.padded / static_cast<size_t>(mics_.hpz->size()) : 0;
      const size_t held = (st.resident ? U.padded : shard + secondary + (st.params_full ? U.padded : 0)) * bc;
      r.frozen_parameters += static_cast<int64_t>(held);
    }
  }
  r.reserved = at(s.reserved_bytes, StatPool::kAggregate).current;
  r.allocated = at(s.allocated_bytes, StatPool::kAggregate).current;
  r.peak_reserved = at(s.reserved_bytes, StatPool::kAggregate).peak;
  r.peak_allocated = at(s.allocated_bytes, StatPool::kAggregate).peak;
  if (host_allocator_ != nullptr) {
    const AllocatorStats h = host_allocator_->stats();
    for (MemoryCategory c : kAllMemoryCategories) {
      r.host_by_category[category_index(c)] = {h.category_requested(c).current, h.category_requested(c).peak};
    }
    r.host_reserved = at(h.reserved_bytes, StatPool::kAggregate).current;
    r.host_allocated = at(h.allocated_bytes, StatPool::kAggregate).current;
    r.host_peak_reserved = at(h.reserved_bytes, StatPool::kAggregate).peak;
  }
  if (offload_ != nullptr && offload_->swap() != nullptr) {
    const OffloadSwap& swap = *offload_->swap();
    const auto master = static_cast<int64_t>(swap.master_file_bytes());
    const auto rest = static_cast<int64_t>(swap.file_bytes()) - master;
    r.nvme_by_category[category_index(MemoryCategory::kMasterWeights)] = {master, master};
    r.nvme_by_category[category_index(MemoryCategory::kOptimizerState)] = {rest, rest};
    r.host_swap_buffers = static_cast<int64_t>(swap.host_buffer_bytes());
  }
  if (param_swap_) {
    // Both slots of every shard in the file (Note [parameter swap regions]),
    // and the pool's block of comm_buffers.
    const auto file = static_cast<int64_t>(param_swap_->file_bytes());
    r.nvme_by_category[category_index(MemoryCategory::kParameters)] = {file, file};
    r.host_swap_buffers += static_cast<int64_t>(param_swap_->host_buffer_bytes());
  }
  const ProcessMemory process = process_memory();
  r.process_rss = process.rss;
  r.process_peak_rss = process.peak_rss;
  r.engine_host_peak = r.host_peak_reserved + (stream_.device().is_host() ? r.peak_reserved : 0);
  return r;
}

}  // namespace zest
