// TorchModule: the module's parameters as views of the engine's memory, and
// autograd hooks that feed the engine's gradient buffers.
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
//
// Note [gradients in place]: autograd hands a leaf's gradient to its
// AccumulateGrad node, which adds it in place into param.grad() when that is
// defined (and grad mode is off, as in a plain backward). A pre-hook on that
// node opens the unit's gradients (engine.grads(), zeroed at the micro-step's
// first use) and points param.grad() at the engine's buffer; a post-hook
// counts the unit's accumulated parameters and, at the last one, calls
// done(), so the reduction starts while backward goes on. (Tensor hooks run
// before accumulation and 1.13 has no post-accumulate hook, hence hooks on
// the node; DDP's reducer hooks the same nodes.) Autograd runs a leaf's
// AccumulateGrad once per backward, after every node that used the leaf,
// with all uses summed: so after the last one of a unit, no node of this
// backward needs the unit's parameters, and stage 3 may release them.
//
// Note [frozen parameters in backward]
// Nothing in autograd tells when a frozen parameter is done with: no
// accumulator runs for it, yet the node of x W^T still reads W to compute
// x's gradient, and it may run after every trainable parameter of its unit
// has accumulated (LoRA: the adapters' accumulators can run first). So the
// frozen memory of a sharded unit, gathered for backward, is kept until
// every node made inside its zt.call has run: after the call, the graph is
// walked back from the call's outputs through the nodes made during it
// (autograd numbers nodes per thread in creation order, so those numbered
// from the call's first to its last), and each gets a post-hook counting
// down one FrozenUse record of the call. When every live record of the unit
// is down to zero its memory is released, as FSDP and DeepSpeed release a
// module's parameters once the gradients of its inputs are computed. The
// hooks hold the record, so a forward never backpropagated leaves none
// once its graph is freed; step() releases what is left (a backward that
// did not reach every node, torch::autograd::grad with inputs).
#include "zest/torch/torch_module.h"

#include <ATen/SequenceNumber.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_set>

#include "zest/checkpoint/weights_io.h"
#include "zest/core/check.h"
#include "zest/core/trim_heap.h"
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

std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i];
  }
  return strides;
}

constexpr const char* kRootUnit = "<root>";

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

struct TorchModule::Unit {
  struct Param {
    std::string name;
    torch::Tensor tensor;  // the module's parameter
    torch::Tensor view;    // into `storage`
    torch::Tensor grad_view;  // into `grad_storage`
    torch::Tensor empty;   // what the parameter is while the unit is released
    std::shared_ptr<torch::autograd::Node> accumulator;  // kept alive: it carries the hooks
  };
  std::string name;
  const torch::nn::Module* module = nullptr;  // the wrapped module for <root>
  std::vector<Param> params;
  bool frozen = false;  // no gradients, hooks or grad storage
  int companion = -1;   // a trainable unit's frozen parameters, gathered with it
  bool sharded = false;  // stage 3 and not persistent: the memory moves between gathers
  c10::Storage storage;
  c10::Storage grad_storage;
  const void* pointed = nullptr;  // the engine's memory the parameters show; null: released
  torch::Tensor widened;          // fp16 on the host: their fp32 copy, where `storage` points
  int forward_depth = 0;
  std::optional<UnitHandle> fwd;  // inside zt.call
  std::optional<UnitHandle> bwd;  // from the first gradient to done()
  std::optional<GradHandle> grads;
  size_t accumulated = 0;  // parameters accumulated in this micro-step
  bool done = false;
  // A sharded frozen unit: the zt.calls whose backward may still read it
  // (Note [frozen parameters in backward]).
  std::vector<std::weak_ptr<FrozenUse>> uses;
};

struct TorchModule::FrozenUse {
  size_t pending = 0;  // the call's nodes that have not run yet
};

struct TorchModule::Hooks {
  // Which parameter a hook is for.
  struct Target {
    TorchModule* tm;
    int unit;
    size_t param;
  };
  struct Pre : torch::autograd::FunctionPreHook {
    explicit Pre(Target t) : target(t) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
      target.tm->before_accumulate(target.unit, target.param);
      return grads;
    }
    Target target;
  };
  // On every node made inside a zt.call of a unit with frozen memory.
  struct NodeRan : torch::autograd::FunctionPostHook {
    NodeRan(TorchModule* t, int u, std::shared_ptr<FrozenUse> r) : tm(t), unit(u), use(std::move(r)) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      // Guarded: a retained graph may run its nodes again.
      if (use->pending > 0 && --use->pending == 0) tm->frozen_use_done(unit);
      return outputs;
    }
    TorchModule* tm;
    int unit;
    std::shared_ptr<FrozenUse> use;
  };
  struct Post : torch::autograd::FunctionPostHook {
    explicit Post(Target t) : target(t) {}
    torch::autograd::variable_list operator()(const torch::autograd::variable_list& outputs,
                                              const torch::autograd::variable_list&) override {
      target.tm->after_accumulate(target.unit, target.param);
      return outputs;
    }
    Target target;
  };
};

namespace {

// A unit as found in the module tree, before registration.
struct FoundUnit {
  std::string name;
  std::string path;  // of the unit's module in the model; "" for the root
  const torch::nn::Module* module = nullptr;
  std::vector<std::pair<std::string, torch::Tensor>> params;
};

// Assigns every parameter to one unit: see the header comment.
std::vector<FoundUnit> find_units(torch::nn::Module& root, const TorchModuleOptions& options) {
  // Each tensor once, under its first name.
  std::vector<std::pair<std::string, torch::Tensor>> all;
  std::map<const void*, std::string> first_name;
  for (const auto& item : root.named_parameters(true)) {
    const void* impl = item.value().unsafeGetTensorImpl();
    if (first_name.emplace(impl, item.key()).second) all.emplace_back(item.key(), item.value());
  }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> unit_modules;
  if (options.units.empty()) {
    for (const auto& child : root.named_children()) unit_modules.emplace_back(child.key(), child.value());
  } else {
    std::map<const torch::nn::Module*, std::string> paths;
    for (const auto& m : root.named_modules("", /*include_self=*/false)) paths.emplace(m.value().get(), m.key());
    for (const auto& m : options.units) {
      ZEST_CHECK(m != nullptr, "TorchModuleOptions::units holds a null module");
      const auto it = paths.find(m.get());
      ZEST_CHECK(it != paths.end(),
                 "TorchModuleOptions::units: a module of type {} is not a descendant of the wrapped "
                 "module; list modules of the model itself",
                 m->name());
      unit_modules.emplace_back(it->second, m);
    }
  }
  std::map<const void*, std::string> owner;  // tensor -> unit name
  std::vector<FoundUnit> units;
  units.push_back({kRootUnit, "", &root, {}});
  for (const auto& [path, m] : unit_modules) {
    FoundUnit u{path, path, m.get(), {}};
    for (const auto& item : m->named_parameters(true)) {
      const void* impl = item.value().unsafeGetTensorImpl();
      const auto [it, fresh] = owner.emplace(impl, path);
      if (!fresh) {
        if (it->second == path) continue;  // registered twice within the unit
        ZEST_FAIL(
            "parameter '{}' is in unit '{}' and in unit '{}' (nested unit modules, or one tensor "
            "registered in two units' modules, such as tied weights): list a module that holds both "
            "as the unit instead",
            first_name.at(impl), it->second, path);
      }
      u.params.emplace_back(first_name.at(impl), item.value());
    }
    if (!u.params.empty()) units.push_back(std::move(u));
  }
  for (const auto& [name, t] : all) {
    if (!owner.count(t.unsafeGetTensorImpl())) units[0].params.emplace_back(name, t);
  }
  if (units[0].params.empty()) units.erase(units.begin());
  ZEST_CHECK(!units.empty(), "the module has no parameters: there is nothing to train");
  // Layout order within a unit: the module's own order.
  std::map<std::string, size_t> order;
  for (size_t i = 0; i < all.size(); ++i) order[all[i].first] = i;
  for (FoundUnit& u : units) {
    std::sort(u.params.begin(), u.params.end(),
              [&](const auto& a, const auto& b) { return order.at(a.first) < order.at(b.first); });
  }
  return units;
}

void check_param(const std::string& name, const torch::Tensor& t) {
  ZEST_CHECK(t.defined(), "parameter '{}' is undefined", name);
  ZEST_CHECK(t.is_floating_point(), "parameter '{}' is {}: only floating-point parameters are trained", name,
             c10::toString(t.scalar_type()));
  ZEST_CHECK(t.layout() == torch::kStrided, "parameter '{}' is not a dense tensor", name);
}

// A unit with trainable and frozen parameters becomes two: the trainable
// ones under the unit's name, then the frozen ones as "<name>:frozen"
// (engine units are all trainable or all frozen). Marks which is which.
std::vector<FoundUnit> split_frozen(std::vector<FoundUnit> found, std::vector<bool>& frozen) {
  std::vector<FoundUnit> out;
  for (FoundUnit& f : found) {
    FoundUnit cold{f.name + ":frozen", f.path, f.module, {}};
    FoundUnit warm{f.name, f.path, f.module, {}};
    for (auto& p : f.params) (p.second.requires_grad() ? warm : cold).params.push_back(std::move(p));
    if (warm.params.empty()) {
      cold.name = f.name;
    } else {
      out.push_back(std::move(warm));
      frozen.push_back(false);
    }
    if (!cold.params.empty()) {
      out.push_back(std::move(cold));
      frozen.push_back(true);
    }
  }
  return out;
}

// Note [deferred construction]
// A placeholder parameter has its shape and no memory (module_construction.h),
// so a model whose units are placeholders costs nothing until the engine
// initializes it. Engine::finalize asks for initial values unit by unit, in
// layout order, on the initializing rank(s): the unit's module is built by
// build_unit when the first of its parameters is asked for, its values
// copied, and the module dropped when the next unit's turn comes. A rank so
// holds at most one unit's values twice over (the engine's fp32 staging of
// the unit and the built module) besides its shards; the heap is trimmed
// after each unit (core/trim_heap.h).
class DeferredValues {
 public:
  DeferredValues(const std::vector<FoundUnit>& found, const TorchModuleOptions& options) : options_(options) {
    size_t params = 0;
    for (const FoundUnit& f : found) {
      for (const auto& [name, t] : f.params) {
        ++params;
        if (is_placeholder(t)) path_of_[name] = f.path;
      }
    }
    all_zero_ = path_of_.size() == params && !options.build_unit;
    ZEST_CHECK(path_of_.empty() || options.build_unit || options.placeholders_loaded_later,
               "{} parameter(s) are placeholders (the first '{}') but TorchModuleOptions::build_unit is unset: "
               "set build_unit to give their initial values, or placeholders_loaded_later when a weights "
               "import follows",
               path_of_.size(), path_of_.empty() ? "" : path_of_.begin()->first);
  }
  bool owns(const std::string& name) const { return path_of_.count(name) > 0; }
  // Every parameter a placeholder loaded later: the engine starts them at
  // zero itself, with no unit staged on the host or broadcast.
  InitFrom init_from() const { return all_zero_ ? InitFrom::kZeros : options_.init_from; }

  void fill(const ParamLayout& p, std::span<float> values) {
    if (!options_.build_unit) return;  // zeros: the engine's staging starts so
    const std::string& path = path_of_.at(p.name);
    if (!built_ || path != built_path_) {
      release();  // the previous unit's values go first
      built_ = options_.build_unit(path);
      ZEST_CHECK(built_ != nullptr, "build_unit('{}') returned a null module", path);
      built_path_ = path;
      params_.clear();
      for (const auto& item : built_->named_parameters(true)) params_.emplace(item.key(), item.value());
    }
    const std::string relative = path.empty() ? p.name : p.name.substr(path.size() + 1);
    const auto it = params_.find(relative);
    ZEST_CHECK(it != params_.end(), "build_unit('{}') built a module without parameter '{}' (it has {} parameters)",
               path, relative, params_.size());
    ZEST_CHECK(it->second.sizes().vec() == p.shape, "build_unit('{}'): parameter '{}' has shape {}, the model's is {}",
               path, relative, c10::str(it->second.sizes()), c10::str(torch::IntArrayRef(p.shape)));
    ZEST_CHECK(!is_placeholder(it->second), "build_unit('{}'): parameter '{}' is itself a placeholder", path, relative);
    const torch::Tensor v = it->second.detach().to(torch::kCPU, torch::kFloat).contiguous();
    std::memcpy(values.data(), v.data_ptr<float>(), values.size() * sizeof(float));
  }
  void release() {
    if (built_ == nullptr) return;
    built_ = nullptr;
    params_.clear();
    trim_heap();
  }

 private:
  const TorchModuleOptions& options_;
  std::map<std::string, std::string> path_of_;  // placeholder parameter -> its unit's path
  std::shared_ptr<torch::nn::Module> built_;
  std::string built_path_;
  std::map<std::string, torch::Tensor> params_;
  bool all_zero_ = false;
};

}  // namespace

std::mutex& module_construction_mutex() {
  static std::mutex mutex;
  return mutex;
}

bool is_placeholder(const torch::Tensor& param) {
  return param.defined() && param.numel() > 0 && param.has_storage() && param.storage().data() == nullptr;
}

void make_placeholders(torch::nn::Module& module, const std::function<bool(const std::string& name)>& which) {
  torch::NoGradGuard no_grad;
  for (const auto& item : module.named_parameters(true)) {
    torch::Tensor p = item.value();
    if (is_placeholder(p) || (which && !which(item.key()))) continue;
    ZEST_CHECK(p.layout() == torch::kStrided, "parameter '{}' is not a dense tensor", item.key());
    const std::vector<int64_t> sizes = p.sizes().vec();
    const c10::Device cpu(torch::kCPU);
    c10::Storage none(c10::Storage::use_byte_size_t(), static_cast<size_t>(p.numel()) * p.element_size(),
                      c10::DataPtr(nullptr, cpu), nullptr, false);
    p.set_data(torch::empty({0}, p.options().device(cpu)).set_(none, 0, sizes, contiguous_strides(sizes)));
  }
  trim_heap();
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
void TorchModule::rewiden() {
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

uint64_t TorchModule::next_node_number() { return at::sequence_number::peek(); }

void TorchModule::after_call(int unit, uint64_t first_node, const std::vector<torch::Tensor>& outputs) {
  for (const torch::Tensor& t : outputs) regather_for_backward(unit, t);
  const Unit& u = *units_[static_cast<size_t>(unit)];
  if (u.frozen && u.sharded) track_frozen_use(unit, first_node, outputs);
  if (u.companion >= 0 && units_[static_cast<size_t>(u.companion)]->sharded) {
    track_frozen_use(u.companion, first_node, outputs);
  }
}

void TorchModule::track_frozen_use(int frozen_unit, uint64_t first_node, const std::vector<torch::Tensor>& outputs) {
  using torch::autograd::Node;
  const uint64_t end = at::sequence_number::peek();
  std::vector<Node*> inside;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  for (const torch::Tensor& t : outputs) {
    if (t.defined() && t.grad_fn() != nullptr) stack.push_back(t.grad_fn().get());
  }
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    // Accumulators are numbered UINT64_MAX, nodes of earlier units lower.
    if (!seen.insert(n).second || n->sequence_nr() < first_node || n->sequence_nr() >= end) continue;
    inside.push_back(n);
    for (const torch::autograd::Edge& e : n->next_edges()) {
      if (e.function != nullptr) stack.push_back(e.function.get());
    }
  }
  if (inside.empty()) return;
  Unit& f = *units_[static_cast<size_t>(frozen_unit)];
  std::erase_if(f.uses, [](const std::weak_ptr<FrozenUse>& w) { return w.expired(); });
  auto use = std::make_shared<FrozenUse>();
  use->pending = inside.size();
  f.uses.push_back(use);
  for (Node* n : inside) n->add_post_hook(std::make_unique<Hooks::NodeRan>(this, frozen_unit, use));
}

void TorchModule::frozen_use_done(int frozen_unit) {
  Unit& f = *units_[static_cast<size_t>(frozen_unit)];
  if (!f.bwd) return;
  for (const std::weak_ptr<FrozenUse>& w : f.uses) {
    if (const auto use = w.lock(); use != nullptr && use->pending > 0) return;
  }
  release_backward(f);
}

void TorchModule::regather_for_backward(int unit, const torch::Tensor& output) {
  // Nothing to gather: the unit and its frozen companion stay in memory (a
  // companion may be sharded where its small trainable unit is not).
  const Unit& u = *units_[static_cast<size_t>(unit)];
  if (!u.sharded && (u.companion < 0 || !units_[static_cast<size_t>(u.companion)]->sharded)) return;
  if (!output.defined() || !output.requires_grad()) return;
  output.register_hook([this, unit](const torch::Tensor&) {
    backward_reached(unit);
    return torch::Tensor();  // the gradient unchanged
  });
}

void TorchModule::backward_reached(int unit) {
  Unit& u = *units_[static_cast<size_t>(unit)];
  if (u.bwd || u.done) return;
  u.bwd.emplace(engine_.gather(unit));
  point_params(u, u.bwd->data());
  // The frozen parameters of the unit take part in its backward too.
  if (u.companion >= 0) backward_reached(u.companion);
}

void TorchModule::before_accumulate(int unit, size_t param) {
  Unit& u = *units_[static_cast<size_t>(unit)];
  Unit::Param& q = u.params[param];
  ZEST_CHECK(!u.done,
             "parameter '{}' received a gradient after unit '{}' finished its gradients in this "
             "micro-step: call zt.step() after each backward (to accumulate over several batches, set "
             "gradient_accumulation_steps and call step() after each)",
             q.name, u.name);
  if (!u.grads) {
    // Gathered already inside a zt.call (a checkpointed unit's
    // recomputation runs its backward there: Note [recompute]).
    if (!u.bwd && u.forward_depth == 0) {
      ZEST_CHECK(!u.sharded,
                 "stage 3: parameter '{}' of unit '{}' received a gradient while the unit was not "
                 "gathered: call the unit through zt.call() or zt.forward(), and return every tensor "
                 "computed from its parameters",
                 q.name, u.name);
      u.bwd.emplace(engine_.gather(unit));
    }
    u.grads.emplace(engine_.grads(unit));
    u.grad_storage.unsafeGetStorageImpl()->set_data_ptr_noswap(
        c10::DataPtr(u.grads->data(), u.grad_storage.device()));
  }
  // Every time: the user may have reset .grad (zero_grad) since.
  const torch::Tensor& g = q.tensor.grad();
  if (!g.defined() || !g.is_same(q.grad_view)) q.tensor.mutable_grad() = q.grad_view;
}

void TorchModule::after_accumulate(int unit, size_t param) {
  Unit& u = *units_[static_cast<size_t>(unit)];
  Unit::Param& q = u.params[param];
  ZEST_CHECK(q.tensor.grad().is_same(q.grad_view),
             "the gradient of parameter '{}' was replaced instead of accumulated in place "
             "(backward with create_graph=true, or a sparse gradient): neither is supported",
             q.name);
  if (++u.accumulated == u.params.size()) finish_grads(u);
}

void TorchModule::finish_grads(Unit& u) {
  u.grads->done();
  u.grads.reset();
  for (Unit::Param& q : u.params) q.tensor.mutable_grad() = torch::Tensor();
  u.done = true;
  release_backward(u);
  // The frozen parameters may still be read by nodes that have not run.
  if (u.companion >= 0) frozen_use_done(u.companion);
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
    if (u.done) continue;
    if (u.grads) {
      finish_grads(u);
      continue;
    }
    engine_.no_grads(i);
    u.done = true;
    if (u.bwd) release_backward(u);  // gathered for a backward that did not reach it
    if (u.companion >= 0) frozen_use_done(u.companion);
  }
  StepResult r = engine_.step();
  if (widen_) rewiden();  // the units that stay gathered have new values
  for (const auto& u : units_) {
    u->done = false;
    u->accumulated = 0;
  }
  return r;
}

std::string TorchModule::save(const std::string& root, const CheckpointOptions& options) {
  return save_checkpoint(engine_, root, options);
}

std::string TorchModule::load(const std::string& root, const CheckpointOptions& options) {
  std::string tag = load_checkpoint(engine_, root, options);
  rewiden();
  return tag;
}

void TorchModule::import_safetensors(const std::string& path, const WeightsImportOptions& options) {
  import_weights(engine_, path, options);
  rewiden();
}

HfImportReport TorchModule::import_hf(const std::string& dir, const HfImportOptions& options) {
  const HfImportReport r = zest::import_hf(engine_, dir, options);
  rewiden();
  return r;
}

HfExportReport TorchModule::export_hf(const std::string& dir, const HfExportOptions& options) {
  return zest::export_hf(engine_, dir, options);
}

void TorchModule::export_safetensors(const std::string& path, DType dtype) {
  WeightsExportOptions o;
  o.dtype = dtype;
  export_weights(engine_, path, o);
}

}  // namespace zest
