// The chunked head and loss (torch/chunked_loss.h) against the whole
// logits and torch's cross_entropy (sum, ignore_index -100): the loss and
// the gradients of the hidden states and the head's weight, for chunks
// that divide the tokens, do not, are one token and are all of them.
//
// Tolerances: fp32, the same products and exponentials with the weight's
// gradient summed over chunks instead of in one product, and the loss's
// sum over tokens in another order: 1e-5 relative (a few ulps of sums of
// ~100 terms). bf16 operands: the logits rounded to bf16 in both, the
// gradients' products in bf16 (8 bits of mantissa) summed in other orders:
// 2e-2 relative.
#include <tuple>

#include "torch_doctest.h"
#include "zest/torch/chunked_loss.h"

namespace {

struct Result {
  torch::Tensor loss, grad_hidden, grad_weight;
};

Result whole(const torch::Tensor& h0, const torch::Tensor& w0, const torch::Tensor& targets) {
  const torch::Tensor h = h0.detach().clone().requires_grad_(true), w = w0.detach().clone().requires_grad_(true);
  const torch::Tensor logits = torch::matmul(h, w.t()).to(torch::kFloat);
  const torch::Tensor loss = torch::nn::functional::cross_entropy(
      logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}),
      torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum));
  (loss * 0.5).backward();  // a grad_output other than 1
  return {loss.detach(), h.grad(), w.grad()};
}

Result chunked(const torch::Tensor& h0, const torch::Tensor& w0, const torch::Tensor& targets, int64_t chunk) {
  const torch::Tensor h = h0.detach().clone().requires_grad_(true), w = w0.detach().clone().requires_grad_(true);
  const torch::Tensor loss = zest::chunked_cross_entropy_sum(h, w, targets, chunk);
  (loss * 0.5).backward();
  return {loss.detach(), h.grad(), w.grad()};
}

bool close(const torch::Tensor& a, const torch::Tensor& b, double rel) {
  const double scale = b.abs().max().item<double>();
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>() <= rel * scale;
}

}  // namespace

TEST_CASE("the chunked head and loss equal the whole logits' cross-entropy, loss and gradients") {
  torch::manual_seed(5);
  for (const auto dtype : {torch::kFloat, torch::kBFloat16}) {
    const std::string type = c10::toString(dtype);
    CAPTURE(type);
    const double rel = dtype == torch::kFloat ? 1e-5 : 2e-2;
    const torch::Tensor hidden = torch::randn({3, 13, 16}).to(dtype);
    const torch::Tensor weight = (torch::randn({300, 16}) * 0.3).to(dtype);
    torch::Tensor targets = torch::randint(0, 300, {3, 13}, torch::kLong);
    targets.index_put_({0, torch::indexing::Slice(0, 5)}, -100);  // a masked prompt
    targets.index_put_({2, 12}, -100);
    const Result want = whole(hidden, weight, targets);
    for (const int64_t chunk : {1, 4, 13, 39, 100}) {
      CAPTURE(chunk);
      const Result got = chunked(hidden, weight, targets, chunk);
      CHECK(close(got.loss, want.loss, rel));
      CHECK(close(got.grad_hidden, want.grad_hidden, rel));
      CHECK(close(got.grad_weight, want.grad_weight, rel));
      CHECK((got.grad_weight.scalar_type() == dtype));
    }
    // A masked token's hidden state gets no gradient.
    CHECK(chunked(hidden, weight, targets, 4).grad_hidden[0].narrow(0, 0, 5).abs().max().item<double>() == 0.0);
  }
  CHECK_THROWS_WITH_AS(zest::chunked_cross_entropy_sum(torch::randn({2, 3}), torch::randn({5, 4}),
                                                       torch::zeros({2}, torch::kLong), 2),
                       doctest::Contains("the weight is [vocab, hidden]"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(zest::chunked_cross_entropy_sum(torch::randn({2, 4}), torch::randn({5, 4}),
                                                       torch::zeros({3}, torch::kLong), 2),
                       doctest::Contains("one target a token"), std::invalid_argument);
}
