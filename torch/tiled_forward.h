// A token-wise module (an MLP, a norm and its projection) applied to a long
// sequence in tiles, with recompute: forward runs `fn` on `tile` tokens at a
// time without keeping its activations, backward runs each tile again with
// grad on and backpropagates it, so the module's intermediate (an MLP's
// [tokens, intermediate] gate, up and product) is held for one tile, never
// for the sequence (ALST's TiledMLP).
//
//   // zest-example: needs=torch
//   torch::nn::Linear up(64, 256), down(256, 64);
//   torch::nn::Sequential mlp(up, torch::nn::Functional(torch::silu), down);
//   torch::Tensor x = torch::randn({2, 4096, 64}, torch::requires_grad());    // [batch, tokens, hidden]
//   torch::Tensor y = zest::tiled_forward(*mlp, x, /*tile=*/512, [&](const torch::Tensor& t) { return mlp->forward(t); });
//   y.sum().backward();
//
// `fn` must act on each token alone (no mixing along dimension 1) and read
// no parameters but `module`'s: their gradients are computed per tile with
// torch::autograd::grad and returned to autograd summed, so each parameter
// is accumulated once, as an untiled call accumulates it (which the
// engine's hooks count on: Note [gradients in place]). Equal to fn(x)
// within fp32 rounding (the parameters' gradients summed over tiles). With
// TorchModule, call it inside the unit's zt.call, as the unit's own code.
#pragma once

#include <cstdint>
#include <functional>

#include <torch/torch.h>

namespace zest {

// x [batch, tokens, ...]; tile >= 1 tokens. Throws std::invalid_argument
// for a tile below 1 or an x of fewer than 2 dimensions.
torch::Tensor tiled_forward(torch::nn::Module& module, const torch::Tensor& x, int64_t tile,
                            std::function<torch::Tensor(const torch::Tensor&)> fn);

}  // namespace zest
