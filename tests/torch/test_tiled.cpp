// Tiled attention (torch/tiled_attention.h) against the whole masked
// softmax, and tiled forward (torch/tiled_forward.h) against the untiled
// call: outputs and gradients, causal, with a sliding window and with
// packed documents, for tiles that divide the tokens, do not, are one token
// and are all of them.
//
// Tolerances: fp32 operands of magnitude ~1 over at most 75 keys: the same
// products and exponentials, the softmax normalized at the end instead of
// first and its sums taken tile by tile: 2e-5 absolute (a few ulps of sums
// of ~75 terms of size ~1, with the 1/sqrt(d) scaled scores below 4).
// tiled_forward: the same per-token arithmetic, the parameters' gradients
// summed over tiles instead of in one product: 1e-5 relative. bf16: the
// probabilities rounded to bf16 before the product in the plain path, kept
// in fp32 in the tiled one: 3e-2 relative (a few bf16 ulps of 2^-8).
#include "torch_doctest.h"
#include "zest/torch/tiled_attention.h"
#include "zest/torch/tiled_forward.h"

namespace test_tiled {

struct Grads {
  torch::Tensor out, dq, dk, dv;
};

torch::Tensor plain_mask(int64_t T, const zest::AttentionMask& m) {
  const torch::Tensor i = torch::arange(T).view({T, 1}), j = torch::arange(T).view({1, T});
  torch::Tensor b = j > i;
  if (m.sliding_window > 0) b = b | (i - j >= m.sliding_window);
  b = b.view({1, 1, T, T});
  if (m.documents.defined()) b = b | (m.documents.unsqueeze(2) != m.documents.unsqueeze(1)).unsqueeze(1);
  return b;
}

// The model's plain path (examples/llama/model.cpp): scores in the
// operands' dtype, the softmax in fp32, cast back, times v.
torch::Tensor plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                    const zest::AttentionMask& m, double scale) {
  torch::Tensor s = torch::matmul(q, k.transpose(2, 3)) * scale;
  s = s.masked_fill(plain_mask(q.size(2), m), -std::numeric_limits<float>::infinity());
  return torch::matmul(torch::softmax(s, -1, torch::kFloat).to(q.scalar_type()), v);
}

template <typename F>
Grads run(const torch::Tensor& q0, const torch::Tensor& k0, const torch::Tensor& v0, const torch::Tensor& dout, F f) {
  const torch::Tensor q = q0.detach().clone().requires_grad_(true), k = k0.detach().clone().requires_grad_(true),
                      v = v0.detach().clone().requires_grad_(true);
  const torch::Tensor out = f(q, k, v);
  out.backward(dout);
  return {out.detach(), q.grad(), k.grad(), v.grad()};
}

double max_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a.to(torch::kDouble) - b.to(torch::kDouble)).abs().max().item<double>();
}

bool close_rel(const torch::Tensor& a, const torch::Tensor& b, double rel) {
  return max_diff(a, b) <= rel * b.to(torch::kDouble).abs().max().item<double>();
}

TEST_CASE("tiled attention equals the whole masked softmax: causal, a sliding window, packed documents") {
  torch::manual_seed(3);
  const int64_t B = 2, H = 3, T = 75, d = 16;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const torch::Tensor q = torch::randn({B, H, T, d}), k = torch::randn({B, H, T, d}), v = torch::randn({B, H, T, d});
  const torch::Tensor dout = torch::randn({B, H, T, d});
  // Row 0: documents of 10, 30 and 35 tokens; row 1: one of 75.
  torch::Tensor docs = torch::zeros({B, T}, torch::kLong);
  docs[0].narrow(0, 10, 30).fill_(1);
  docs[0].narrow(0, 40, 35).fill_(2);
  const auto mask = [](int64_t window, const torch::Tensor& documents) {
    zest::AttentionMask m;
    m.sliding_window = window;
    m.documents = documents;
    return m;
  };
  for (const zest::AttentionMask& m : {mask(0, {}), mask(20, {}), mask(0, docs), mask(7, docs)}) {
    const Grads want = run(q, k, v, dout, [&](auto& a, auto& b, auto& c) { return plain(a, b, c, m, scale); });
    for (int64_t tile : {1, 16, 25, 75, 100}) {
      CAPTURE(tile);
      CAPTURE(m.sliding_window);
      CAPTURE(m.documents.defined());
      const Grads got =
          run(q, k, v, dout, [&](auto& a, auto& b, auto& c) { return zest::tiled_attention(a, b, c, m, scale, tile); });
      CHECK(max_diff(got.out, want.out) <= 2e-5);
      CHECK(max_diff(got.dq, want.dq) <= 2e-5);
      CHECK(max_diff(got.dk, want.dk) <= 2e-5);
      CHECK(max_diff(got.dv, want.dv) <= 2e-5);
    }
  }
  // bf16 operands.
  const auto bf = [](const torch::Tensor& t) { return t.to(torch::kBFloat16); };
  const zest::AttentionMask m = mask(0, docs);
  const Grads want =
      run(bf(q), bf(k), bf(v), bf(dout), [&](auto& a, auto& b, auto& c) { return plain(a, b, c, m, scale); });
  const Grads got = run(bf(q), bf(k), bf(v), bf(dout),
                        [&](auto& a, auto& b, auto& c) { return zest::tiled_attention(a, b, c, m, scale, 16); });
  CHECK((got.out.scalar_type() == torch::kBFloat16));
  CHECK(close_rel(got.out, want.out, 3e-2));
  CHECK(close_rel(got.dq, want.dq, 3e-2));
  CHECK(close_rel(got.dk, want.dk, 3e-2));
  CHECK(close_rel(got.dv, want.dv, 3e-2));
  // Shapes that do not match are refused by name.
  CHECK_THROWS_WITH_AS(zest::tiled_attention(q, k.narrow(2, 0, 5), v, {}, scale, 8), doctest::Contains("k as q"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(zest::tiled_attention(q, k, v, {}, scale, 0), doctest::Contains("at least 1"),
                       std::invalid_argument);
}

TEST_CASE("tiled forward equals the untiled call: output, input and parameter gradients, frozen parameters kept") {
  torch::manual_seed(5);
  torch::nn::Linear up(12, 40), down(40, 12);
  down->bias.set_requires_grad(false);  // frozen: no gradient, as a LoRA base
  torch::nn::Sequential mlp(up, torch::nn::Functional(torch::silu), down);
  const torch::Tensor x0 = torch::randn({3, 50, 12}), dy = torch::randn({3, 50, 12});
  const auto grads = [&](bool input_grad, int64_t tile) {
    for (auto& p : mlp->parameters()) p.mutable_grad() = torch::Tensor();
    const torch::Tensor x = x0.clone().requires_grad_(input_grad);
    const auto fn = [&](const torch::Tensor& t) { return mlp->forward(t); };
    const torch::Tensor y = tile > 0 ? zest::tiled_forward(*mlp, x, tile, fn) : fn(x);
    y.backward(dy);
    std::vector<torch::Tensor> out{y.detach(), input_grad ? x.grad() : torch::Tensor()};
    for (auto& p : mlp->parameters()) out.push_back(p.grad().defined() ? p.grad().clone() : torch::Tensor());
    return out;
  };
  for (bool input_grad : {true, false}) {
    const auto want = grads(input_grad, 0);
    for (int64_t tile : {1, 7, 50, 64}) {
      CAPTURE(tile);
      const auto got = grads(input_grad, tile);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        REQUIRE(got[i].defined() == want[i].defined());
        if (got[i].defined()) CHECK(close_rel(got[i], want[i], 1e-5));
      }
    }
  }
  CHECK(!down->bias.grad().defined());
}

}  // namespace test_tiled
