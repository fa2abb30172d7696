// Attention that never holds the [T, T] scores: queries and keys in tiles
// with an online softmax (FlashAttention's algorithm, in libtorch
// operations), in forward and again in backward, so that a layer's
// attention memory grows with T x tile instead of T x T (ALST's and
// FlashAttention's answer to long sequences).
//
//   // zest-example: needs=torch
//   torch::Tensor q = torch::randn({1, 4, 512, 32}, torch::requires_grad());  // [batch, heads, tokens, head_dim]
//   torch::Tensor k = torch::randn({1, 4, 512, 32}), v = torch::randn({1, 4, 512, 32});
//   torch::Tensor out = zest::tiled_attention(q, k, v, {.causal = true}, 1.0 / std::sqrt(32.0), /*tile=*/128);
//   out.sum().backward();
//
// softmax(q k^T x scale, masked) v, with the mask of a decoder: causal, a
// sliding window (key j blocked for query i when i - j >= window, mistral's),
// and packed documents (a key of another document blocked). The products
// q k^T are taken in the operands' dtype and scaled there, as the plain path
// does, the softmax and its accumulation in fp32; the output in the
// operands' dtype. Forward keeps the output and each row's log-sum-exp;
// backward recomputes each tile's probabilities from them. Key tiles wholly
// above the diagonal (causal) or behind the window are skipped. Equal to
// the plain path (softmax of the whole masked scores, then times v) within
// fp32 rounding: the same sums in another order (tests/torch/
// test_tiled_attention.cpp states the bound). Every query must see at least
// its own key (a decoder's masks always let it).
#pragma once

#include <cstdint>

#include <torch/torch.h>

namespace zest {

struct AttentionMask {
  bool causal = true;
  int64_t sliding_window = 0;  // > 0: i - j >= window is blocked
  torch::Tensor documents = {};  // [batch, tokens] int64, or undefined: keys of another document blocked
};

// q, k, v [batch, heads, tokens, head_dim] (grouped-query keys and values
// repeated to the query heads); tile >= 1 tokens. Throws
// std::invalid_argument naming shapes that do not match.
torch::Tensor tiled_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const AttentionMask& mask, double scale, int64_t tile);

}  // namespace zest
