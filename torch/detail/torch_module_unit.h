// TorchModule's record of one unit (internal to the libtorch layer): the
// torch side of it only, the tensors that view the engine's memory, the
// gathers that hold it and the hooks that feed its gradients. Where the
// unit's gradients are in a micro-step (not opened, open, done) is the
// engine's (Engine::grad_state), not recorded here a second time.
#pragma once

#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zest/torch/torch_module.h"

namespace zest {

// The strides of a contiguous tensor of these sizes.
inline std::vector<int64_t> contiguous_strides(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> strides(sizes.size());
  int64_t s = 1;
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = s;
    s *= sizes[i];
  }
  return strides;
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
  std::optional<GradHandle> grads;  // open: from the first accumulation to done()
  size_t accumulated = 0;  // parameters accumulated in this micro-step
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

}  // namespace zest
