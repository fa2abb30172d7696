#include "zest/torch/tiled_attention.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace zest {

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

struct Tiles {
  int64_t tokens = 0, tile = 0, window = 0;
  bool causal = true;
  torch::Tensor documents;

  // The first and one past the last key of the key tiles that query tile
  // [qs, qs + nq) may see.
  std::pair<int64_t, int64_t> keys(int64_t qs, int64_t nq) const {
    const int64_t end = causal ? qs + nq : tokens;
    int64_t begin = 0;
    if (window > 0) begin = std::max<int64_t>(0, qs - window + 1) / tile * tile;
    return {begin, end};
  }

  // [batch or 1, 1, nq, nk]: true where query i may not see key j.
  torch::Tensor blocked(int64_t qs, int64_t nq, int64_t ks, int64_t nk, const torch::Device& device) const {
    const auto idx = torch::TensorOptions().dtype(torch::kLong).device(device);
    const torch::Tensor i = torch::arange(qs, qs + nq, idx).view({nq, 1});
    const torch::Tensor j = torch::arange(ks, ks + nk, idx).view({1, nk});
    torch::Tensor b = causal ? j > i : torch::zeros({nq, nk}, idx.dtype(torch::kBool));
    if (window > 0) b = b | (i - j >= window);
    b = b.view({1, 1, nq, nk});
    if (documents.defined()) {
      const torch::Tensor other =
          documents.narrow(1, qs, nq).unsqueeze(2) != documents.narrow(1, ks, nk).unsqueeze(1);  // [B, nq, nk]
      b = b | other.unsqueeze(1);
    }
    return b;
  }

  // The scores of a tile, in fp32, masked with -inf.
  torch::Tensor scores(const torch::Tensor& q, const torch::Tensor& k, double scale, int64_t qs, int64_t nq,
                       int64_t ks, int64_t nk) const {
    torch::Tensor s = (torch::matmul(q, k.transpose(2, 3)) * scale).to(torch::kFloat);
    return s.masked_fill(blocked(qs, nq, ks, nk, q.device()), -kInf);
  }
};

Tiles tiles_of(torch::autograd::AutogradContext* ctx) {
  Tiles t;
  t.tokens = ctx->saved_data["tokens"].toInt();
  t.tile = ctx->saved_data["tile"].toInt();
  t.window = ctx->saved_data["window"].toInt();
  t.causal = ctx->saved_data["causal"].toBool();
  return t;
}

struct TiledAttention : torch::autograd::Function<TiledAttention> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, const c10::optional<torch::Tensor>& docs, double scale,
                               int64_t tile, int64_t window, bool causal) {
    const torch::Tensor documents = docs.has_value() ? *docs : torch::Tensor();
    const Tiles t{q.size(2), tile, window, causal, documents};
    const int64_t B = q.size(0), H = q.size(1), T = q.size(2), d = v.size(3);
    torch::Tensor out = torch::empty({B, H, T, d}, q.options());
    torch::Tensor lse = torch::empty({B, H, T}, q.options().dtype(torch::kFloat));
    for (int64_t qs = 0; qs < T; qs += tile) {
      const int64_t nq = std::min(tile, T - qs);
      const torch::Tensor Q = q.narrow(2, qs, nq);
      torch::Tensor m = torch::full({B, H, nq}, -kInf, lse.options());
      torch::Tensor l = torch::zeros({B, H, nq}, lse.options());
      torch::Tensor acc = torch::zeros({B, H, nq, d}, lse.options());
      const auto [kbegin, kend] = t.keys(qs, nq);
      for (int64_t ks = kbegin; ks < kend; ks += tile) {
        const int64_t nk = std::min(tile, T - ks);
        const torch::Tensor s = t.scores(Q, k.narrow(2, ks, nk), scale, qs, nq, ks, nk);
        const torch::Tensor m_new = torch::maximum(m, std::get<0>(s.max(-1)));
        // Rows that have seen no key yet keep -inf: subtract 0 there.
        const torch::Tensor m_safe = torch::where(torch::isinf(m_new), torch::zeros_like(m_new), m_new);
        const torch::Tensor alpha = torch::exp(m - m_safe);
        const torch::Tensor p = torch::exp(s - m_safe.unsqueeze(-1));
        l = l * alpha + p.sum(-1);
        acc = acc * alpha.unsqueeze(-1) + torch::matmul(p, v.narrow(2, ks, nk).to(torch::kFloat));
        m = m_new;
      }
      out.narrow(2, qs, nq).copy_(acc / l.unsqueeze(-1));
      lse.narrow(2, qs, nq).copy_(m + torch::log(l));
    }
    ctx->save_for_backward({q, k, v, documents, out, lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["tokens"] = T;
    ctx->saved_data["tile"] = tile;
    ctx->saved_data["window"] = window;
    ctx->saved_data["causal"] = causal;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const torch::Tensor &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[4], &lse = saved[5];
    Tiles t = tiles_of(ctx);
    t.documents = saved[3];
    const double scale = ctx->saved_data["scale"].toDouble();
    const torch::Tensor dout = grads[0].to(torch::kFloat);
    const int64_t T = t.tokens, tile = t.tile;
    // D_i = sum_d dO_id O_id: the softmax's backward per row.
    const torch::Tensor D = (dout * out.to(torch::kFloat)).sum(-1);
    torch::Tensor dq = torch::zeros(q.sizes(), dout.options());
    torch::Tensor dk = torch::zeros(k.sizes(), dout.options());
    torch::Tensor dv = torch::zeros(v.sizes(), dout.options());
    for (int64_t qs = 0; qs < T; qs += tile) {
      const int64_t nq = std::min(tile, T - qs);
      const torch::Tensor Q = q.narrow(2, qs, nq), dO = dout.narrow(2, qs, nq);
      const torch::Tensor L = lse.narrow(2, qs, nq).unsqueeze(-1), Dq = D.narrow(2, qs, nq).unsqueeze(-1);
      const auto [kbegin, kend] = t.keys(qs, nq);
      for (int64_t ks = kbegin; ks < kend; ks += tile) {
        const int64_t nk = std::min(tile, T - ks);
        const torch::Tensor K = k.narrow(2, ks, nk), V = v.narrow(2, ks, nk);
        const torch::Tensor p = torch::exp(t.scores(Q, K, scale, qs, nq, ks, nk) - L);  // blocked: exp(-inf) = 0
        dv.narrow(2, ks, nk).add_(torch::matmul(p.transpose(2, 3), dO));
        const torch::Tensor ds = p * (torch::matmul(dO, V.to(torch::kFloat).transpose(2, 3)) - Dq);
        dq.narrow(2, qs, nq).add_(torch::matmul(ds, K.to(torch::kFloat)) * scale);
        dk.narrow(2, ks, nk).add_(torch::matmul(ds.transpose(2, 3), Q.to(torch::kFloat)) * scale);
      }
    }
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), torch::Tensor(),
            torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

}  // namespace

torch::Tensor tiled_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const AttentionMask& mask, double scale, int64_t tile) {
  if (tile < 1) throw std::invalid_argument(fmt::format("an attention tile of {} tokens: give at least 1", tile));
  if (q.dim() != 4 || k.sizes() != q.sizes() || v.dim() != 4 || v.sizes().slice(0, 3) != q.sizes().slice(0, 3)) {
    throw std::invalid_argument(fmt::format("tiled_attention: q {}, k {}, v {}: each [batch, heads, tokens, head_dim], "
                                            "k as q (repeat grouped keys and values to the query heads)",
                                            c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes())));
  }
  if (mask.documents.defined() &&
      (mask.documents.dim() != 2 || mask.documents.size(0) != q.size(0) || mask.documents.size(1) != q.size(2))) {
    throw std::invalid_argument(fmt::format("tiled_attention: documents {} for {} rows of {} tokens",
                                            c10::str(mask.documents.sizes()), q.size(0), q.size(2)));
  }
  if (mask.sliding_window < 0) {
    throw std::invalid_argument(fmt::format("tiled_attention: a sliding window of {}", mask.sliding_window));
  }
  const c10::optional<torch::Tensor> documents =
      mask.documents.defined() ? c10::optional<torch::Tensor>(mask.documents) : c10::nullopt;
  return TiledAttention::apply(q, k, v, documents, scale, tile, mask.sliding_window, mask.causal);
}

}  // namespace zest
