// A torch::nn::Module trained through a ZEST engine: ZeRO stages 0-3 for a
// libtorch training loop, with a few added lines (target zest::torch,
// find_package(zest COMPONENTS torch)).
//
//   // zest-example: prelude=torch_training
//   auto model = std::make_shared<Net>();                 // any torch::nn::Module
//   zest::Engine engine(config, *comm, alloc, zest::Stream::default_for(comm->device()));
//   zest::TorchModule zt(engine, model);                  // one unit per top-level child
//   for (;;) {
//     torch::Tensor loss = torch::mse_loss(model->forward(x), y);   // x, y: this rank's batch
//     zt.scale(loss).backward();                          // gradients go to the engine
//     zest::StepResult r = zt.step();                     // r.lr, r.grad_norm, r.applied
//   }
//   zt.save("ckpt");  zt.load("ckpt");                    // ZEST checkpoints (any world size)
//   zt.export_safetensors("model.safetensors");           // the module's own parameter names
//
// (Checkpoints and weights in and out are torch_module_io.h's free
// functions; the members of the same names call them.)
//
// Stage 3 additionally needs each unit called through the wrapper, so that
// it is gathered for its forward and again for its backward:
//
//   // zest-example: prelude=torch_module
//   for (auto& block : blocks) x = zt.forward(block, x);  // was: x = block->forward(x)
//   x = zt.call(*head, [&] { return head->forward(x); });  // any code using one unit
//
// What happens:
// - Units. options.units lists child modules (anywhere in the tree), each a
//   unit; the parameters no listed module holds form one more unit, "<root>".
//   Without a list: one unit per top-level child with parameters, and the
//   root's own parameters as "<root>". Engine names are the module's
//   named_parameters() names, so checkpoints and safetensors use them.
// - Construction registers the units (groups from options.group, declared on
//   the engine beforehand), finalizes the engine with the module's current
//   values (rank 0's, broadcast, by default: like DDP), and makes every
//   parameter a view of the engine's memory in the compute dtype (a bf16
//   engine leaves a bf16 module; an fp16 engine on the host backend leaves
//   an fp32 module over a widened copy, since libtorch's CPU kernels lack
//   fp16: gradients and loss scaling stay fp16's, torch_module.cpp's Note
//   [fp16 on the host]). Stages 0-2: the gathered parameters, for
//   good. Stage 3: a unit's parameters are views while it is gathered
//   (inside zt.call, and in backward from the first gradient that reaches
//   one of its outputs until its gradients are done) and empty tensors (0
//   elements) otherwise.
// - backward: each parameter's gradient is added by autograd straight into
//   the engine's gradient buffer (param.grad() is a view of it, set just
//   before autograd accumulates), and when every parameter of a unit has
//   received its gradient, the unit's reduction starts while backward goes
//   on. A unit whose parameters got no gradient (unused in this micro-step)
//   contributes zeros at step(). Outside backward, param.grad() is
//   undefined: the engine owns the gradients, reduced and sharded.
// - Evaluation: at stage 3 a unit called under torch's no-grad mode
//   (torch::NoGradGuard) is gathered for the engine's inference order, not
//   training's (Pass::kInference, engine.h), as DeepSpeed keeps a parameter
//   coordinator for each; call engine.end_forward() after each such forward
//   to replay one forward's order (DeepSpeed's end-of-forward hook), or let
//   the next training forward end it. zt.read gathers a unit outside
//   forward and backward, in no order.
// - step() is the engine's micro-step: once after every backward, and with
//   gradient_accumulation_steps = k the optimizer steps every k-th call. The
//   engine averages gradients over ranks and micro-steps, so each rank's loss
//   is the mean over its own micro-batch (torch's reduction 'mean'), and the
//   update equals torch's on the global batch. zero_grad() is not needed.
//
// Frozen parameters: a parameter whose requires_grad() is false when the
// TorchModule is made is registered frozen (engine.h): no gradient, no
// optimizer state, its value fixed, saved with checkpoints. The frozen
// parameters of a unit with trainable ones form a unit of their own,
// "<unit>:frozen", right after it, gathered and released with it; a unit
// whose parameters are all frozen is one frozen unit. Turning requires_grad
// on or off afterwards changes nothing: make a new engine and TorchModule
// (a weights-only load carries the values over).
//
// Supported: any forward made of torch operations on the parameters, with
// parameters used any number of times within their unit's forward; units
// called in any order, also more than once; modules whose buffers are
// constants (options.allow_buffers). Refused with a zest::Error:
// - a parameter reachable under two units (nested unit modules, or one
//   tensor registered in two units' modules: put both modules in one unit);
//   a tensor registered twice within one unit is one parameter, under its
//   first name;
// - parameters that are not floating-point or not dense;
// - buffers, unless options.allow_buffers (they stay the module's: not
//   sharded, averaged or checkpointed, so they must be equal on every rank);
// - at stage 3, a gradient reaching a sharded unit that is not gathered (its
//   parameters were used outside zt.call); backward with create_graph, or a
//   sparse gradient (they would replace the engine's gradient view); a second
//   backward before step().
// At stage 3, a tensor computed inside zt.call from the unit's parameters
// must leave it through the return value (a Tensor, a vector of them or a
// tuple): a tensor kept aside has no re-gather attached to its backward.
// Every rank must run the same units' backward in the same order (as DDP
// requires), since reductions are collectives.
//
// On CUDA, torch's current stream must be the engine's stream (torch's
// default is the legacy default stream: Stream::default_for(device)).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include <torch/torch.h>

#include "zest/engine/engine.h"
#include "zest/torch/module_construction.h"

namespace zest {

// The I/O's options and reports (torch_module_io.h includes their headers).
struct CheckpointOptions;
struct WeightsImportOptions;
struct HfImportOptions;
struct HfImportReport;
struct HfExportOptions;
struct HfExportReport;

// torch's name for a ZEST device: where a TorchModule's parameters live and
// so where its inputs go (`tokens.to(zest::torch_device(comm.device()))`).
torch::Device torch_device(Device d);
// ZEST's name for torch's float types, for the collectives and transfers
// that move torch tensors. Throws a zest::Error naming the type for any
// other, with `what` the tensors moved ("pipeline activations").
DType from_torch_dtype(torch::ScalarType t, std::string_view what);

// Why a TorchModule cannot train over this group on this device, or "" when
// it can. libtorch runs the backward of CUDA tensors on one autograd thread
// per device, for every thread of the process: in-process ranks sharing a
// GPU (the in-process backend puts its whole group on one device) would
// each block that thread in their gradient hooks' collectives waiting for
// the others, whose backward cannot run. `ranks` and `tp_size` are the
// data-parallel and tensor-parallel group sizes (either one's collectives
// run in backward). The TorchModule constructor throws this message.
std::string backward_thread_conflict(std::string_view backend, Device device, int ranks, int tp_size);

struct TorchModuleOptions {
  // Child modules that are units; empty: one per top-level child.
  std::vector<std::shared_ptr<torch::nn::Module>> units;
  // A parameter's group (declared with engine.add_param_group first), from
  // its name; unset: "default" for all (torch.optim's single group).
  std::function<std::string(const std::string& name, const torch::Tensor& param)> group;
  // Buffers are refused unless set: see the header comment.
  bool allow_buffers = false;
  InitFrom init_from = InitFrom::kRank0;
  // Deferred construction (module_construction.h): the initial values of a
  // unit whose parameters are placeholders come from build_unit(path), with
  // path the unit module's path in the model ("" for the root's own
  // parameters): a module whose named_parameters() are the unit's, named
  // relative to that path. It is called on the initializing rank(s) as the
  // engine initializes that unit, and dropped before the next.
  std::function<std::shared_ptr<torch::nn::Module>(const std::string& path)> build_unit;
  // Placeholders without build_unit start at zero, for a weights import
  // (import_hf, a weights-only load) to overwrite before training; unset,
  // they are an error.
  bool placeholders_loaded_later = false;
};

class TorchModule {
 public:
  // Registers and finalizes the engine (collective), which must be fresh.
  TorchModule(Engine& engine, std::shared_ptr<torch::nn::Module> module, TorchModuleOptions options = {});
  template <typename Impl>
  TorchModule(Engine& engine, const torch::nn::ModuleHolder<Impl>& module, TorchModuleOptions options = {})
      : TorchModule(engine, module.ptr(), std::move(options)) {}
  ~TorchModule();
  TorchModule(const TorchModule&) = delete;
  TorchModule& operator=(const TorchModule&) = delete;

  // loss x the engine's loss scale (fp16; 1 otherwise, and then `loss`
  // itself): call backward() on this.
  torch::Tensor scale(const torch::Tensor& loss) const;
  // The engine's step(), after each backward: see the header comment.
  StepResult step();

  // Runs fn with unit `unit` gathered and arranges its re-gather for
  // backward; returns what fn returns. Needed at stage 3 only, harmless at
  // stages 0-2.
  template <typename F>
  auto call(int unit, F&& fn) -> std::invoke_result_t<F> {
    Gathered scope(*this, unit);
    const uint64_t first_node = next_node_number();
    auto out = std::forward<F>(fn)();
    std::vector<torch::Tensor> outputs;
    for_each_tensor(out, [&](const torch::Tensor& t) { outputs.push_back(t); });
    after_call(unit, first_node, outputs);
    return out;
  }
  template <typename F>
  auto call(const torch::nn::Module& unit_module, F&& fn) -> std::invoke_result_t<F> {
    return call(unit_of(unit_module), std::forward<F>(fn));
  }
  // call(m, [&] { return m->forward(args...); }) for a unit module held by
  // a ModuleHolder or shared_ptr.
  template <typename M, typename... Args>
  auto forward(M& module, Args&&... args) {
    return call(*module, [&] { return module->forward(std::forward<Args>(args)...); });
  }

  // Runs fn with unit `unit` gathered, under torch::NoGradGuard, to read or
  // send its values outside forward and backward (DeepSpeed's
  // GatheredParameters): nothing backward reaches, and at stage 3 no part of
  // the engine's recorded gather orders (Pass::kNone). Returns what fn
  // returns.
  //
  //   // zest-example: prelude=torch_module
  //   const double norm = zt.read(*head, [&] { return head->weight.norm().item<double>(); });
  template <typename F>
  auto read(int unit, F&& fn) -> std::invoke_result_t<F> {
    const torch::NoGradGuard no_grad;
    Gathered scope(*this, unit, Pass::kNone);
    return std::forward<F>(fn)();
  }
  template <typename F>
  auto read(const torch::nn::Module& unit_module, F&& fn) -> std::invoke_result_t<F> {
    return read(unit_of(unit_module), std::forward<F>(fn));
  }

  // Activation checkpointing (DeepSpeed's checkpointing.checkpoint, torch's
  // checkpoint with use_reentrant): runs the unit as forward()/call() do
  // but keeps only its tensor inputs for backward, not what autograd would
  // save inside it; its backward gathers the unit again (stage 3), runs it
  // again from the forward's random-number state, and backpropagates
  // through that. Gradients are the bits of an uncheckpointed call on the
  // host backend. A checkpointed unit is called once per backward (its
  // gradients are complete after its one recomputation).
  //
  //   // zest-example: prelude=torch_module
  //   for (auto& block : blocks) x = zt.checkpoint(block, x);   // was: x = zt.forward(block, x)
  //
  // checkpoint(M& module, inputs...) calls module->forward(inputs...);
  // checkpoint_call(unit_module, fn, inputs...) calls fn(inputs...), which
  // returns one tensor and takes everything it computes from other tensors
  // as a constant. Both keep the module or fn until backward (by value).
  template <typename M, typename... T>
  torch::Tensor checkpoint(M& module, const T&... inputs) {
    return checkpoint_call(
        *module, [holder = module](const T&... in) mutable { return holder->forward(in...); }, inputs...);
  }
  template <typename F, typename... T>
  torch::Tensor checkpoint_call(const torch::nn::Module& unit_module, F&& fn, const T&... inputs) {
    return checkpoint_call(
        unit_of(unit_module),
        [f = std::forward<F>(fn)](const std::vector<torch::Tensor>& in) mutable {
          return call_with(f, in, std::index_sequence_for<T...>{});
        },
        std::vector<torch::Tensor>{inputs...});
  }
  torch::Tensor checkpoint_call(int unit, std::function<torch::Tensor(const std::vector<torch::Tensor>&)> fn,
                                std::vector<torch::Tensor> inputs);

  // The unit index of a unit module; throws for a module that is not one.
  int unit_of(const torch::nn::Module& unit_module) const;
  int num_units() const;

  // Collective: checkpoints and weights in and out, by the module's
  // parameter names: torch_module_io.h's functions of the same names (its
  // header has the options' and reports' types).
  std::string save(const std::string& root);
  std::string save(const std::string& root, const CheckpointOptions& options);
  std::string load(const std::string& root);
  std::string load(const std::string& root, const CheckpointOptions& options);
  void export_safetensors(const std::string& path, DType dtype = DType::kFloat32);
  void import_safetensors(const std::string& path);
  void import_safetensors(const std::string& path, const WeightsImportOptions& options);
  HfImportReport import_hf(const std::string& dir);
  HfImportReport import_hf(const std::string& dir, const HfImportOptions& options);
  HfExportReport export_hf(const std::string& dir);
  HfExportReport export_hf(const std::string& dir, const HfExportOptions& options);
  // After the engine's values changed other than through this module (a
  // load or import given the engine itself): the module shows the new
  // values. Only an fp16 engine on the host, whose module computes over a
  // widened copy (Note [fp16 on the host]), has anything to do.
  void values_changed();

  Engine& engine() { return engine_; }
  torch::nn::Module& module() { return *module_; }

 private:
  struct Unit;
  class Gathered {
   public:
    // `pass`: unset, a forward's (Pass::kTraining, or kInference under
    // torch's no-grad mode).
    Gathered(TorchModule& tm, int unit, std::optional<Pass> pass = std::nullopt);
    ~Gathered();
    Gathered(const Gathered&) = delete;
    Gathered& operator=(const Gathered&) = delete;

   private:
    TorchModule& tm_;
    int unit_;
  };

  template <typename R, typename Fn>
  static void for_each_tensor(const R& r, Fn&& fn) {
    if constexpr (std::is_convertible_v<const R&, const torch::Tensor&>) {
      fn(static_cast<const torch::Tensor&>(r));
    } else if constexpr (requires { std::tuple_size<R>::value; }) {
      std::apply([&](const auto&... e) { (for_each_tensor(e, fn), ...); }, r);
    } else if constexpr (requires { r.begin(); r.end(); }) {
      for (const auto& e : r) for_each_tensor(e, fn);
    }
  }

  struct Hooks;
  struct FrozenUse;
  struct Recompute;
  template <typename F, size_t... I>
  static torch::Tensor call_with(F& fn, const std::vector<torch::Tensor>& in, std::index_sequence<I...>) {
    return fn(in[I]...);
  }
  Unit& unit(int u);
  static uint64_t next_node_number();
  void after_call(int unit, uint64_t first_node, const std::vector<torch::Tensor>& outputs);
  void regather_for_backward(int unit, const torch::Tensor& output);
  void track_frozen_use(int frozen_unit, uint64_t first_node, const std::vector<torch::Tensor>& outputs);
  void frozen_use_done(int frozen_unit);
  void backward_reached(int unit);
  void before_accumulate(int unit, size_t param);
  void after_accumulate(int unit, size_t param);
  void finish_grads(Unit& u);
  void point_params(Unit& u, const void* data);
  // Gathered's work for one unit (a unit and its frozen companion).
  void enter_forward(int unit, std::optional<Pass> pass);
  bool grads_done(int unit) const { return engine_.grad_state(unit) == Engine::GradState::kDone; }
  void leave_forward(int unit);
  void release_backward(Unit& u);
  void unpoint_params(Unit& u);


  Engine& engine_;
  std::shared_ptr<torch::nn::Module> module_;
  bool widen_ = false;  // fp16 on the host: Note [fp16 on the host]
  std::vector<std::unique_ptr<Unit>> units_;
};

}  // namespace zest
