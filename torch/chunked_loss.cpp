#include "zest/torch/chunked_loss.h"

#include <stdexcept>

#include <fmt/format.h>

namespace zest {

namespace {

struct ChunkedCrossEntropy : torch::autograd::Function<ChunkedCrossEntropy> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& hidden,
                               const torch::Tensor& weight, const torch::Tensor& targets, int64_t chunk) {
    const torch::Tensor h = hidden.reshape({-1, hidden.size(-1)});
    const torch::Tensor t = targets.reshape({-1});
    torch::Tensor sum = torch::zeros({}, hidden.options().dtype(torch::kFloat));
    for (int64_t at = 0; at < h.size(0); at += chunk) {
      const int64_t n = std::min(chunk, h.size(0) - at);
      const torch::Tensor logits = torch::matmul(h.narrow(0, at, n), weight.t()).to(torch::kFloat);
      const torch::Tensor tc = t.narrow(0, at, n);
      const torch::Tensor trained = tc != -100;
      const torch::Tensor picked = logits.gather(1, tc.clamp_min(0).unsqueeze(1)).squeeze(1);
      sum = sum + ((torch::logsumexp(logits, 1) - picked) * trained.to(torch::kFloat)).sum();
    }
    ctx->save_for_backward({hidden, weight, targets});
    ctx->saved_data["chunk"] = chunk;
    return sum;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor& hidden = saved[0];
    const torch::Tensor& weight = saved[1];
    const torch::Tensor h = hidden.reshape({-1, hidden.size(-1)});
    const torch::Tensor t = saved[2].reshape({-1});
    const int64_t chunk = ctx->saved_data["chunk"].toInt();
    const torch::Tensor scale = grads[0].to(torch::kFloat);
    torch::Tensor grad_h = torch::empty_like(h);
    torch::Tensor grad_w = torch::zeros_like(weight, weight.options().dtype(torch::kFloat));
    for (int64_t at = 0; at < h.size(0); at += chunk) {
      const int64_t n = std::min(chunk, h.size(0) - at);
      const torch::Tensor hc = h.narrow(0, at, n);
      const torch::Tensor tc = t.narrow(0, at, n);
      // d(logsumexp - picked)/d logits = softmax - one-hot, on trained rows.
      torch::Tensor g = torch::softmax(torch::matmul(hc, weight.t()).to(torch::kFloat), 1);
      g.scatter_add_(1, tc.clamp_min(0).unsqueeze(1), -torch::ones({n, 1}, g.options()));
      g.mul_(((tc != -100).to(torch::kFloat) * scale).unsqueeze(1));
      const torch::Tensor gd = g.to(hidden.scalar_type());
      grad_h.narrow(0, at, n).copy_(torch::matmul(gd, weight));
      grad_w.add_(torch::matmul(gd.t(), hc).to(torch::kFloat));
    }
    return {grad_h.reshape(hidden.sizes()), grad_w.to(weight.scalar_type()), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor chunked_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                        const torch::Tensor& targets, int64_t chunk) {
  if (chunk < 1) throw std::invalid_argument(fmt::format("a loss chunk of {} tokens: give at least 1", chunk));
  if (weight.dim() != 2 || hidden.dim() < 1 || hidden.size(-1) != weight.size(1)) {
    throw std::invalid_argument(fmt::format("chunked_cross_entropy_sum: hidden {} against a head weight {}: the "
                                            "weight is [vocab, hidden]",
                                            c10::str(hidden.sizes()), c10::str(weight.sizes())));
  }
  if (targets.sizes() != hidden.sizes().slice(0, hidden.dim() - 1)) {
    throw std::invalid_argument(fmt::format("chunked_cross_entropy_sum: targets {} for hidden {}: one target a token",
                                            c10::str(targets.sizes()), c10::str(hidden.sizes())));
  }
  return ChunkedCrossEntropy::apply(hidden, weight, targets, chunk);
}

}  // namespace zest
