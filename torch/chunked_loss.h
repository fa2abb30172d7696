// A language model's head and cross-entropy in chunks of tokens: the summed
// loss of logits = hidden x weight^T against targets, computed `chunk`
// tokens at a time in forward and again in backward, so that no more than
// one chunk's logits [chunk, vocab] are ever held (Liger's fused linear
// cross-entropy, ALST's tiled loss). With a 128k vocabulary the whole
// logits of 8k tokens are 4 GiB in fp32; a chunk of 1024 holds 0.5 GiB.
//
//   // zest-example: prelude=torch_module
//   torch::Tensor hidden = torch::randn({2, 8, 4}, torch::requires_grad());   // [batch, tokens, hidden]
//   torch::Tensor targets = torch::randint(0, 4, {2, 8}, torch::kLong);       // -100: not trained on
//   torch::Tensor loss = zest::chunked_cross_entropy_sum(hidden, head->weight, targets, /*chunk=*/4);
//   loss.backward();
//
// The logits are computed in the operands' dtype and the loss in fp32, as
// a head followed by Hugging Face's upcast loss computes them; targets of
// -100 add nothing. Gradients: the softmax minus the target, recomputed per
// chunk, times grad_output; the weight's gradient summed over the chunks
// (the unchunked product's sums in another order: fp32 rounding apart).
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace zest {

// hidden [..., H], weight [V, H], targets [...] int64 (the shape of hidden
// without its last dimension). Returns the fp32 scalar sum over the trained
// tokens. chunk >= 1 tokens a piece. Throws std::invalid_argument for shapes
// that do not match, naming them.
torch::Tensor chunked_cross_entropy_sum(const torch::Tensor& hidden, const torch::Tensor& weight,
                                        const torch::Tensor& targets, int64_t chunk);

}  // namespace zest
