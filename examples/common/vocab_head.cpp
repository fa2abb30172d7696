#include "common/vocab_head.h"

#include "zest/torch/tensor_parallel.h"

namespace examples {

torch::Tensor vocab_loss_mean(const torch::Tensor& logits, const torch::Tensor& targets, zest::Communicator* tp) {
  if (tp != nullptr) return zest::tp::vocab_parallel_cross_entropy(logits, targets, *tp).mean();
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

torch::Tensor vocab_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets, zest::Communicator* tp) {
  if (tp != nullptr) return zest::tp::vocab_parallel_cross_entropy(logits, targets, *tp).sum();
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
