// What the examples' language models share at their head, whole or split
// over a tensor-parallel group by vocabulary (common/staged_lm.h): the
// token losses of the last stage's logits, the whole vocabulary's logits,
// and logits of a head tied to the word embeddings.
#pragma once

#include <torch/torch.h>

#include "zest/comm/communicator.h"

namespace examples {

// The mean (vocab_loss_mean) or the sum (vocab_loss_sum) of the
// cross-entropies of logits [B, T, vocab / tp], in their own dtype, against
// targets [B, T]: vocabulary-parallel over `tp` when given, the same on
// every tp rank.
torch::Tensor vocab_loss_mean(const torch::Tensor& logits, const torch::Tensor& targets, zest::Communicator* tp);
torch::Tensor vocab_loss_sum(const torch::Tensor& logits, const torch::Tensor& targets, zest::Communicator* tp);

// The whole vocabulary's logits from this rank's slice (tp ranks gather).
torch::Tensor whole_vocab_logits(const torch::Tensor& logits, zest::Communicator* tp);

// x [B, T, hidden] against the word embeddings `weight` [vocab / tp, hidden]
// (this rank's rows): Megatron's parallel_lm_logits. x is whole on every tp
// rank, so its gradient, a sum over the vocabulary's slices, is all-reduced.
torch::Tensor tied_head_logits(const torch::Tensor& x, const torch::Tensor& weight, zest::Communicator* tp);

}  // namespace examples
