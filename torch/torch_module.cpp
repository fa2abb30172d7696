// TorchModule: construction (the units registered and finalized, their
// parameters made views of the engine's memory), the gathers a zt.call
// holds, and step(). The autograd hooks are in torch_module_hooks.cpp, unit
// discovery in unit_discovery.cpp, the I/O in torch_module_io.cpp.
//
// Note [one storage per unit]: every parameter of a unit is a view into one
// c10::Storage whose data pointer is the engine's flat buffer of the unit.
// At stage 3 the buffer moves with every gather; re-pointing the storage
// (set_data_ptr_noswap) moves every tensor that views it, including views
// autograd saved in forward (w.t() for a matmul), which is what lets a unit
// released after its forward be gathered again for its backward, as FSDP
// does by resizing its flat parameter's storage. The leaf parameters
// themselves are set to empty tensors while released, so a forward that
// uses them outside zt.call fails in torch's shape checks instead of reading
// freed memory. Gradients work the same way over a second storage.
#include "zest/torch/torch_module.h"

#include <algorithm>
#include <map>
#include <optional>

#include "zest/core/check.h"
#include "zest/torch/detail/deferred_values.h"
#include "zest/torch/detail/torch_module_unit.h"
#include "zest/torch/detail/unit_discovery.h"
#include "zest/torch/tensor_parallel.h"

namespace zest {
namespace {

torch::ScalarType torch_dtype(DType d) {
  switch (d) {
    case DType::kFloat32: return torch::kFloat;
    case DType::kFloat16: return torch::kHalf;
    case DType::kBFloat16: return torch::kBFloat16;
    default: ZEST_FAIL("the engine's compute dtype {} has no torch equivalent", dtype_name(d));
  }
}

}  // namespace

torch::Device torch_device(Device d) {
  return d.is_cuda() ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(d.index()))
                     : torch::Device(torch::kCPU);
}

DType from_torch_dtype(torch::ScalarType t, std::string_view what) {
  switch (t) {
    case torch::kFloat: return DType::kFloat32;
    case torch::kHalf: return DType::kFloat16;
    case torch::kBFloat16: return DType::kBFloat16;
    default: ZEST_FAIL("{} are float32, float16 or bfloat16, not {}", what, c10::toString(t));
  }
}

std::string backward_thread_conflict(std::string_view backend, Device device, int ranks, int tp_size) {
  if (backend != "in-process" || !device.is_cuda() || (ranks <= 1 && tp_size <= 1)) return {};
  return fmt::format(
      "TorchModule: {} in-process ranks share {}{}, and libtorch runs the backward of all of them on "
      "its one autograd thread for that GPU: a rank's gradient hook waiting in a collective for the "
      "others would wait for ever, their backward queued behind it. Run one rank per process and GPU "
      "(--launch, mpirun, srun or torchrun, over NCCL), or compare stages with in-process ranks on "
      "the host device",
      std::max(ranks, 1) * std::max(tp_size, 1), device.str(),
      tp_size > 1 ? fmt::format(" ({} of them a tensor-parallel group)", tp_size) : std::string());
}

TorchModule::TorchModule(Engine& engine, std::shared_ptr<torch::nn::Module> module, TorchModuleOptions options)
    : engine_(engine), module_(std::move(module)) {
  ZEST_CHECK(module_ != nullptr, "TorchModule: the module is null");
  {
    const Communicator& comm = engine_.comm();
    const std::string conflict =
        backward_thread_conflict(comm.backend_name(), comm.device(), comm.size(), engine_.model_parallel().tp_size);
    ZEST_CHECK(conflict.empty(), "{}", conflict);
  }
  if (!options.allow_buffers) {
    const auto buffers = module_->named_buffers(true);
    ZEST_CHECK(buffers.is_empty(),
               "the module has {} buffer(s), the first '{}': ZEST does not shard, average or checkpoint "
               "buffers. If they are constants equal on every rank (a causal mask), set "
               "TorchModuleOptions::allow_buffers",
               buffers.size(), buffers.is_empty() ? "" : buffers.keys().front());
  }
  std::vector<bool> frozen;
  std::vector<FoundUnit> found = split_frozen(find_units(*module_, options), frozen);
  std::map<std::string, torch::Tensor> by_name;
  // With tensor parallelism, what the tp layers do not split is whole on
  // every tp rank: the global gradient norm counts it once. What they split
  // carries its split, by which an export joins the slices.
  const bool tensor_parallel = engine_.model_parallel().tp_size > 1;
  std::map<std::string, TpSplit> splits;
  if (tensor_parallel) splits = tp::partitioned_parameter_splits(*module_);
  for (size_t i = 0; i < found.size(); ++i) {
    const FoundUnit& f = found[i];
    std::vector<ParamSpec> specs;
    for (const auto& [name, t] : f.params) {
      check_param(name, t);
      specs.push_back({name, t.sizes().vec(), options.group ? options.group(name, t) : "default", !frozen[i]});
      const auto split = splits.find(name);
      specs.back().tp_replicated = tensor_parallel && split == splits.end();
      if (split != splits.end()) specs.back().tp_split = split->second;
      by_name.emplace(name, t);
    }
    engine_.add_unit(f.name, std::move(specs));
  }
  DeferredValues deferred(found, options);
  // InitFrom::kZeros starts every parameter at zero: one the module gave
  // values (an adapter's random A, a layer built eagerly) would lose them
  // without a word.
  if (options.init_from == InitFrom::kZeros) {
    for (const FoundUnit& f : found) {
      for (const auto& [name, t] : f.params) {
        ZEST_CHECK(is_placeholder(t) || t.numel() == 0 || t.detach().count_nonzero().item<int64_t>() == 0,
                   "TorchModuleOptions::init_from is kZeros, which would zero parameter '{}', whose values the "
                   "module set (not all zero): use InitFrom::kRank0 (or kEveryRank) to keep them, or make it a "
                   "placeholder (make_placeholders) when a weights import fills it",
                   name);
      }
    }
  }
  engine_.finalize(
      [&](const ParamLayout& p, std::span<float> values) {
        if (deferred.owns(p.name)) return deferred.fill(p, values);
        const torch::Tensor v = by_name.at(p.name).detach().to(torch::kCPU, torch::kFloat).contiguous();
        ZEST_INTERNAL_ASSERT(static_cast<size_t>(v.numel()) == values.size(), "parameter '{}' size", p.name);
        std::memcpy(values.data(), v.data_ptr<float>(), values.size() * sizeof(float));
      },
      deferred.init_from());
  deferred.release();

  const DType dtype = engine_.compute_dtype();
  // Note [fp16 on the host]: the module computes in fp32 over a widened copy.
  widen_ = dtype == DType::kFloat16 && !engine_.comm().device().is_cuda();
  const torch::TensorOptions grad_opts =
      torch::TensorOptions().dtype(torch_dtype(dtype)).device(torch_device(engine_.comm().device()));
  const torch::TensorOptions opts = widen_ ? grad_opts.dtype(torch::kFloat) : grad_opts;
  const c10::Device device = opts.device();
  const ModelLayout& L = engine_.layout();
  torch::NoGradGuard no_grad;
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitLayout& UL = L.unit(u);
    auto unit = std::make_unique<Unit>();
    unit->name = UL.name;
    unit->module = found[static_cast<size_t>(u)].module;
    unit->sharded = !engine_.persistent(u);
    unit->frozen = UL.frozen;
    if (UL.frozen && u > 0 && found[static_cast<size_t>(u) - 1].module == unit->module && !frozen[static_cast<size_t>(u) - 1]) {
      units_.back()->companion = u;
    }
    const size_t bytes = UL.padded * elem_size(dtype);
    unit->storage = c10::Storage(c10::Storage::use_byte_size_t(), UL.padded * (widen_ ? 4 : elem_size(dtype)),
                                 c10::DataPtr(nullptr, device), nullptr, false);
    if (!UL.frozen) {
      unit->grad_storage =
          c10::Storage(c10::Storage::use_byte_size_t(), bytes, c10::DataPtr(nullptr, device), nullptr, false);
    }
    for (const ParamLayout& p : UL.params) {
      Unit::Param q;
      q.name = p.name;
      q.tensor = by_name.at(p.name);
      const std::vector<int64_t> strides = contiguous_strides(p.shape);
      q.view = torch::empty({0}, opts).set_(unit->storage, static_cast<int64_t>(p.offset), p.shape, strides);
      if (!UL.frozen) {
        q.grad_view =
            torch::empty({0}, grad_opts).set_(unit->grad_storage, static_cast<int64_t>(p.offset), p.shape, strides);
      }
      q.empty = torch::empty({0}, opts);
      unit->params.push_back(std::move(q));
    }
    // The parameters take their shapes and the compute dtype now: autograd
    // records both in each parameter's accumulator, made after this (a new
    // dtype gives a parameter a new accumulator).
    if (unit->sharded) {
      for (Unit::Param& q : unit->params) q.tensor.set_data(q.view);  // over a null storage for now
    } else {
      // Not part of a forward: the training order starts with the first.
      const UnitHandle h = engine_.gather(u, Pass::kNone);
      point_params(*unit, h.data());
    }
    units_.push_back(std::move(unit));
  }
  for (int u = 0; u < L.num_units(); ++u) {
    Unit& unit = *units_[static_cast<size_t>(u)];
    for (size_t i = 0; i < unit.params.size() && !unit.frozen; ++i) {
      Unit::Param& q = unit.params[i];
      q.tensor.mutable_grad() = torch::Tensor();
      q.accumulator = torch::autograd::impl::grad_accumulator(q.tensor);
      ZEST_INTERNAL_ASSERT(q.accumulator != nullptr, "parameter '{}' has no gradient accumulator", q.name);
      q.accumulator->add_pre_hook(std::make_unique<Hooks::Pre>(Hooks::Target{this, u, i}));
      q.accumulator->add_post_hook(std::make_unique<Hooks::Post>(Hooks::Target{this, u, i}));
    }
    if (unit.sharded) unpoint_params(unit);
  }
}

TorchModule::~TorchModule() {
  // The hooks point here and the views at the engine's memory: the module
  // keeps owned copies of what is in memory (stage 3's released units stay
  // empty), and its accumulators lose our hooks.
  torch::NoGradGuard no_grad;
  for (const auto& unit : units_) {
    for (Unit::Param& q : unit->params) {
      if (q.accumulator == nullptr) {  // frozen
        q.tensor.set_data(unit->pointed != nullptr ? q.view.clone() : q.empty);
        continue;
      }
      auto& pre = q.accumulator->pre_hooks();
      pre.erase(std::remove_if(pre.begin(), pre.end(),
                               [](const auto& h) { return dynamic_cast<Hooks::Pre*>(h.get()) != nullptr; }),
                pre.end());
      auto& post = q.accumulator->post_hooks();
      post.erase(std::remove_if(post.begin(), post.end(),
                                [](const auto& h) { return dynamic_cast<Hooks::Post*>(h.get()) != nullptr; }),
                 post.end());
      q.tensor.mutable_grad() = torch::Tensor();
      q.tensor.set_data(unit->pointed != nullptr ? q.view.clone() : q.empty);
    }
  }
}

void TorchModule::point_params(Unit& u, const void* data) {
  if (u.pointed == data) return;
  const void* shown = data;
  if (widen_) {
    u.widened = torch::from_blob(const_cast<void*>(data), {static_cast<int64_t>(u.storage.nbytes() / 4)}, torch::kHalf)
                    .to(torch::kFloat);
    shown = u.widened.data_ptr();
  }
  u.storage.unsafeGetStorageImpl()->set_data_ptr_noswap(
      c10::DataPtr(const_cast<void*>(shown), u.storage.device()));
  if (u.pointed == nullptr) {
    for (Unit::Param& q : u.params) q.tensor.set_data(q.view);
  }
  u.pointed = data;
}

void TorchModule::unpoint_params(Unit& u) {
  u.storage.unsafeGetStorageImpl()->set_data_ptr_noswap(c10::DataPtr(nullptr, u.storage.device()));
  for (Unit::Param& q : u.params) q.tensor.set_data(q.empty);
  u.pointed = nullptr;
  u.widened = torch::Tensor();
}

// Note [fp16 on the host]
// libtorch's CPU kernels have no fp16 matrix product, SiLU or LayerNorm
// (1.13), so an fp16 engine on the host backend gives the module fp32
// parameters: the unit's fp16 values widened (exactly) into a copy when it
// is gathered, and again after each step for the units that stay gathered.
// Gradients still land in the engine's fp16 buffers (autograd adds an fp32
// gradient into an fp16 .grad in place, rounding once), so loss scaling,
// overflow and skipped steps behave as fp16's: a scaled gradient past
// 65504 is inf there. This is what CPU autocast would do had it fp16; the
// arithmetic inside the module is fp32's, not a GPU's fp16.
void TorchModule::values_changed() {
  for (const auto& u : units_) {
    if (u->pointed == nullptr || !u->widened.defined()) continue;
    const torch::NoGradGuard no_grad;
    u->widened.copy_(torch::from_blob(const_cast<void*>(u->pointed), {u->widened.numel()}, torch::kHalf));
  }
}

torch::Tensor TorchModule::scale(const torch::Tensor& loss) const {
  const double s = engine_.loss_scale();
  return s == 1.0 ? loss : loss * s;
}

int TorchModule::num_units() const { return static_cast<int>(units_.size()); }

int TorchModule::unit_of(const torch::nn::Module& unit_module) const {
  for (size_t u = 0; u < units_.size(); ++u) {
    if (units_[u]->module == &unit_module) return static_cast<int>(u);
  }
  ZEST_FAIL("module of type {} is not a unit of this TorchModule (units: one per top-level child with "
            "parameters, or TorchModuleOptions::units)",
            unit_module.name());
}

TorchModule::Unit& TorchModule::unit(int u) {
  ZEST_CHECK(u >= 0 && u < num_units(), "unit index {} is out of range: the module has {} units", u, num_units());
  return *units_[static_cast<size_t>(u)];
}

TorchModule::Gathered::Gathered(TorchModule& tm, int unit, std::optional<Pass> pass) : tm_(tm), unit_(unit) {
  tm.enter_forward(unit, pass);
  if (const int c = tm.unit(unit).companion; c >= 0) tm.enter_forward(c, pass);
}

TorchModule::Gathered::~Gathered() {
  if (const int c = tm_.unit(unit_).companion; c >= 0) tm_.leave_forward(c);
  tm_.leave_forward(unit_);
}

void TorchModule::enter_forward(int unit, std::optional<Pass> pass) {
  Unit& u = this->unit(unit);
  if (u.forward_depth++ == 0) {
    // A forward with no backward to follow follows the engine's inference
    // order (Note [a gather order per kind of pass], engine_gather.cpp).
    u.fwd.emplace(engine_.gather(
        unit, pass.value_or(torch::GradMode::is_enabled() ? Pass::kTraining : Pass::kInference)));
    if (u.sharded) point_params(u, u.fwd->data());
  }
}

void TorchModule::leave_forward(int unit) {
  Unit& u = this->unit(unit);
  if (--u.forward_depth > 0) return;
  if (u.sharded && !u.bwd) unpoint_params(u);
  u.fwd.reset();
}

void TorchModule::release_backward(Unit& u) {
  if (u.sharded && u.forward_depth == 0) unpoint_params(u);
  u.bwd.reset();
}

StepResult TorchModule::step() {
  bool any = false;
  for (const auto& u : units_) {
    ZEST_CHECK(u->forward_depth == 0, "zt.step() inside zt.call() of unit '{}'", u->name);
    any = any || u->accumulated > 0;
  }
  ZEST_CHECK(any, "zt.step() without gradients: call backward() on zt.scale(loss) first");
  // Units whose gradients are not complete are finished in index order
  // (the same on every rank): those some parameters' gradients reached with
  // what backward wrote, and those none reached with zeros, ungathered
  // (Engine::no_grads: their reduction is still a collective, so a rank
  // whose batch skipped a unit joins the others' reductions of it).
  for (int i = 0; i < num_units(); ++i) {
    Unit& u = *units_[static_cast<size_t>(i)];
    // A frozen unit has no gradients; what backward gathered of it (a unit
    // all frozen, which no accumulator tells the end of) goes back now.
    if (u.frozen) {
      if (u.bwd) release_backward(u);
      u.uses.clear();
      continue;
    }
    if (grads_done(i)) continue;
    if (u.grads) {
      finish_grads(u);
      continue;
    }
    engine_.no_grads(i);
    if (u.bwd) release_backward(u);  // gathered for a backward that did not reach it
    if (u.companion >= 0) frozen_use_done(u.companion);
  }
  StepResult r = engine_.step();
  if (widen_) values_changed();  // the units that stay gathered have new values
  for (const auto& u : units_) u->accumulated = 0;
  return r;
}

}  // namespace zest
