#include "common/vocab_head.h"

#include <utility>

#include "zest/torch/tensor_parallel.h"

namespace examples {

namespace {

// Vocabulary-parallel token losses with the targets of -100 (not trained
// on) giving 0, as torch's cross_entropy ignores them; and how many count.
std::pair<torch::Tensor, torch::Tensor> parallel_token_losses(const torch::Tensor& logits, const torch::Tensor& targets,
                                                              zest::Communicator& tp) {
  const torch::Tensor trained = targets != -100;
  const torch::Tensor losses = zest::tp::vocab_parallel_cross_entropy(logits, targets.clamp_min(0), tp);
  return {losses * trained.to(losses.scalar_type()), trained.sum()};
}

}  // namespace

torch::Tensor vocab_loss_mean(const torch::Tensor& logits, const torch::Tensor& targets, zest::Communicator* tp) {
  if (tp != nullptr) {
    if (!(targets == -100).any().item<bool>()) {
      return zest::tp::vocab_parallel_cross_entropy(logits, targets, *tp).mean();
    }
    const auto [losses, count] = parallel_token_losses(logits, targets, *tp);
    return losses.sum() / count.to(losses.scalar_type());
  }
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

torch::Tensor vocab_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets, zest::Communicator* tp) {
  if (tp != nullptr) return parallel_token_losses(logits, targets, *tp).first.sum();
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
                                              torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
}

torch::Tensor whole_vocab_logits(const torch::Tensor& logits, zest::Communicator* tp) {
  return tp == nullptr ? logits : zest::tp::gather_from_region(logits, *tp, -1);
}

torch::Tensor tied_head_logits(const torch::Tensor& x, const torch::Tensor& weight, zest::Communicator* tp) {
  return torch::matmul(tp != nullptr ? zest::tp::copy_to_region(x, *tp) : x, weight.t());
}

}  // namespace examples
