// TorchModule's autograd side: the hooks that open, fill and finish a
// unit's gradients in the engine's buffers, and the re-gathers that bring a
// released unit back for its backward.
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
#include <ATen/SequenceNumber.h>

#include <unordered_set>

#include "zest/core/check.h"
#include "zest/torch/detail/torch_module_unit.h"

namespace zest {

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
  if (u.bwd || grads_done(unit)) return;
  u.bwd.emplace(engine_.gather(unit));
  point_params(u, u.bwd->data());
  // The frozen parameters of the unit take part in its backward too.
  if (u.companion >= 0) backward_reached(u.companion);
}

void TorchModule::before_accumulate(int unit, size_t param) {
  Unit& u = *units_[static_cast<size_t>(unit)];
  Unit::Param& q = u.params[param];
  ZEST_CHECK(!grads_done(unit),
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
  release_backward(u);
  // The frozen parameters may still be read by nodes that have not run.
  if (u.companion >= 0) frozen_use_done(u.companion);
}

}  // namespace zest
