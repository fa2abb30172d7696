// Activation checkpointing for TorchModule (torch_module.h, checkpoint()
// and checkpoint_call()).
//
// Note [recompute]
// The forward runs the unit under no_grad, so autograd saves nothing inside
// it, and the output gets one node of ours, Recompute, whose next edges are
// the inputs' (as torch's reentrant checkpoint does). Its backward gathers
// the unit again (a Gathered scope: at stage 3 the unit was released after
// its forward), restores the random-number state the forward started from,
// runs fn again with grad on over detached copies of the inputs, and
// backpropagates the output's gradient through that graph: the unit's
// parameters accumulate into the engine's buffers through the usual
// accumulator hooks (Note [gradients in place]), and the inputs' gradients
// come back as this node's outputs. The frozen part of the unit stays
// gathered for the whole of it (the scope holds it), so nothing need track
// which nodes read it. The recomputation does the forward's operations in
// the forward's order, so the gradients have the bits of an uncheckpointed
// call.
#include <ATen/CPUGeneratorImpl.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>

#include <algorithm>

#include "zest/core/check.h"
#include "zest/torch/torch_module.h"

namespace zest {

namespace {

// The default CPU generator's state: dropout and other random operations
// draw the same numbers in the recomputation as in the forward. (A CUDA
// model's device generator is not saved: a checkpointed CUDA unit must be
// deterministic.)
at::Tensor cpu_rng_state() {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

void set_cpu_rng_state(const at::Tensor& state) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  const std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(state);
}

}  // namespace

struct TorchModule::Recompute : torch::autograd::Node {
  // With cpu_checkpointing (EngineConfig::checkpoint_in_host_memory) a
  // device's inputs wait in host memory and come back for the recompute.
  Recompute(TorchModule& t, int u, std::function<torch::Tensor(const std::vector<torch::Tensor>&)> f,
            const std::vector<torch::Tensor>& in, at::Tensor rng, bool to_host)
      : tm(t), unit(u), fn(std::move(f)), rng_state(std::move(rng)) {
    for (const torch::Tensor& x : in) {
      requires_grad.push_back(x.defined() && x.requires_grad());
      devices.push_back(x.defined() ? x.device() : torch::Device(torch::kCPU));
      inputs.push_back(to_host && x.defined() && !x.is_cpu() ? x.detach().to(torch::kCPU) : x.detach());
    }
  }

  std::string name() const override { return "zest::TorchModule::Recompute"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    std::vector<torch::Tensor> detached;
    for (size_t i = 0; i < inputs.size(); ++i) {
      torch::Tensor d = inputs[i].defined() ? inputs[i].to(devices[i]) : inputs[i];
      if (requires_grad[i]) d.requires_grad_(true);
      detached.push_back(d);
    }
    {
      const at::Tensor now = cpu_rng_state();
      set_cpu_rng_state(rng_state);
      const torch::AutoGradMode grad_on(true);
      Gathered scope(tm, unit);
      torch::Tensor out = fn(detached);
      set_cpu_rng_state(now);
      if (out.requires_grad() && grads.at(0).defined()) torch::autograd::backward({out}, {grads[0]});
    }
    torch::autograd::variable_list result;
    for (const torch::Tensor& d : detached) result.push_back(d.defined() && d.requires_grad() ? d.grad() : torch::Tensor());
    inputs.clear();  // what the checkpoint kept: free it now
    return result;
  }

  void release_variables() override { inputs.clear(); }

  TorchModule& tm;
  int unit;
  std::function<torch::Tensor(const std::vector<torch::Tensor>&)> fn;
  std::vector<torch::Tensor> inputs;  // detached: the graph before them is reached through the edges
  std::vector<bool> requires_grad;
  std::vector<torch::Device> devices;
  at::Tensor rng_state;
};

torch::Tensor TorchModule::checkpoint_call(int unit, std::function<torch::Tensor(const std::vector<torch::Tensor>&)> fn,
                                      std::vector<torch::Tensor> inputs) {
  this->unit(unit);  // range check
  at::Tensor rng = cpu_rng_state();
  torch::Tensor out;
  {
    Gathered scope(*this, unit);
    const torch::NoGradGuard no_grad;
    out = fn(inputs);
  }
  ZEST_CHECK(out.defined(), "zt.checkpoint(): unit '{}' returned an undefined tensor",
             engine_.layout().unit(unit).name);
  if (!torch::GradMode::is_enabled() || !out.is_floating_point()) return out;
  // A view, an input or a parameter returned as it is cannot take a grad_fn
  // of ours (and a parameter's memory goes with the unit): a copy can.
  const bool is_input = std::any_of(inputs.begin(), inputs.end(), [&](const torch::Tensor& x) { return x.is_same(out); });
  if (out.is_view() || out.requires_grad() || is_input) out = out.clone();
  const bool to_host = engine_.config().checkpoint_in_host_memory;
  auto node = std::make_shared<Recompute>(*this, unit, std::move(fn), inputs, std::move(rng), to_host);
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::set_history(out, node);
  return out;
}

}  // namespace zest
