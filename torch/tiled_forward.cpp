#include "zest/torch/tiled_forward.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

namespace zest {

namespace {

// What backward needs beyond tensors: the function and the module's
// trainable parameters, in the order their gradients are returned.
struct TiledFn : torch::CustomClassHolder {
  std::function<torch::Tensor(const torch::Tensor&)> fn;
  int64_t tile = 0;
};

struct TiledForward : torch::autograd::Function<TiledForward> {
  // params: the module's trainable parameters, inputs of this node so that
  // autograd hands each its summed gradient once.
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& x,
                               const c10::intrusive_ptr<TiledFn>& f, torch::TensorList params) {
    std::vector<torch::Tensor> pieces;
    for (int64_t at = 0; at < x.size(1); at += f->tile) {
      pieces.push_back(f->fn(x.narrow(1, at, std::min(f->tile, x.size(1) - at))));
    }
    std::vector<torch::Tensor> saved{x};
    saved.insert(saved.end(), params.begin(), params.end());
    ctx->save_for_backward(saved);
    ctx->saved_data["fn"] = c10::IValue::make_capsule(f);
    return torch::cat(pieces, 1);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const torch::autograd::variable_list saved = ctx->get_saved_variables();
    const torch::Tensor& x = saved[0];
    const std::vector<torch::Tensor> params(saved.begin() + 1, saved.end());
    const auto f = c10::static_intrusive_pointer_cast<TiledFn>(ctx->saved_data["fn"].toCapsule());
    torch::Tensor dx = x.requires_grad() ? torch::empty_like(x) : torch::Tensor();
    std::vector<torch::Tensor> dparams(params.size());
    for (int64_t at = 0; at < x.size(1); at += f->tile) {
      const int64_t n = std::min(f->tile, x.size(1) - at);
      const torch::Tensor xt = x.narrow(1, at, n).detach().requires_grad_(x.requires_grad());
      torch::Tensor yt;
      {
        torch::AutoGradMode grad_on(true);
        yt = f->fn(xt);
      }
      std::vector<torch::Tensor> wrt;
      if (x.requires_grad()) wrt.push_back(xt);
      wrt.insert(wrt.end(), params.begin(), params.end());
      if (wrt.empty() || !yt.requires_grad()) continue;
      // grad, not backward: nothing accumulates into .grad here; the sums go
      // back to autograd, which accumulates each parameter once.
      const torch::autograd::variable_list g =
          torch::autograd::grad({yt}, wrt, {grads[0].narrow(1, at, n)}, /*retain_graph=*/false,
                                /*create_graph=*/false, /*allow_unused=*/true);
      size_t i = 0;
      if (x.requires_grad()) dx.narrow(1, at, n).copy_(g[i++]);
      for (size_t p = 0; p < params.size(); ++p, ++i) {
        if (!g[i].defined()) continue;
        dparams[p] = dparams[p].defined() ? dparams[p] + g[i] : g[i];
      }
    }
    torch::autograd::variable_list out{dx, torch::Tensor()};
    out.insert(out.end(), dparams.begin(), dparams.end());
    return out;
  }
};

}  // namespace

torch::Tensor tiled_forward(torch::nn::Module& module, const torch::Tensor& x, int64_t tile,
                            std::function<torch::Tensor(const torch::Tensor&)> fn) {
  if (tile < 1) throw std::invalid_argument(fmt::format("a tile of {} tokens: give at least 1", tile));
  if (x.dim() < 2) {
    throw std::invalid_argument(fmt::format("tiled_forward: x {} has no token dimension (dimension 1)",
                                            c10::str(x.sizes())));
  }
  // Without grad there is nothing to recompute: tiles still bound the memory.
  if (!torch::GradMode::is_enabled()) {
    std::vector<torch::Tensor> pieces;
    for (int64_t at = 0; at < x.size(1); at += tile) pieces.push_back(fn(x.narrow(1, at, std::min(tile, x.size(1) - at))));
    return torch::cat(pieces, 1);
  }
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : module.parameters()) {
    if (p.requires_grad()) params.push_back(p);
  }
  auto f = c10::make_intrusive<TiledFn>();
  f->fn = std::move(fn);
  f->tile = tile;
  return TiledForward::apply(x, f, torch::TensorList(params));
}

}  // namespace zest
