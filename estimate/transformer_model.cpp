#include "zest/estimate/transformer_model.h"

#include <vector>

#include <fmt/format.h>

#include "zest/core/check.h"

namespace zest {
namespace {

// Counts are checked against kMaxModelNumel in doubles before any product
// is formed in size_t.
// A layer's parameters in Megatron's order (ParallelTransformerLayer:
// norm, QKV, projection, norm, fc1, fc2, each weight before its bias), on
// one of t tensor-parallel ranks. T: size_t for the layout, double for the
// overflow check.
template <typename T>
std::vector<T> layer_params(const TransformerShape& s, T t) {
  const T h = static_cast<T>(s.hidden), f = static_cast<T>(s.ffn()), d = static_cast<T>(s.head_width());
  const T q = static_cast<T>(s.heads) * d;
  const T qkv = q + 2 * static_cast<T>(s.groups()) * d;
  const T fc1 = s.swiglu ? 2 * f : f;
  std::vector<T> out;
  const auto norm = [&] {
    out.push_back(h);
    if (!s.rms_norm) out.push_back(h);
  };
  // Row-parallel biases are whole on every tp rank, column-parallel ones split.
  const auto linear = [&](T weight, T bias) {
    out.push_back(weight);
    if (s.linear_bias) out.push_back(bias);
  };
  norm();
  linear(qkv * h / t, qkv / t);
  if (s.qkv_bias && !s.linear_bias) out.push_back(qkv / t);
  if (s.qk_norm) {
    out.push_back(d);
    out.push_back(d);
  }
  linear(h * q / t, h);
  norm();
  linear(fc1 * h / t, fc1 / t);
  linear(h * f / t, h);
  return out;
}

template <typename T>
T sum(const std::vector<T>& v) {
  T total = 0;
  for (const T x : v) total += x;
  return total;
}

double numel_of(const TransformerShape& s) {
  const double h = static_cast<double>(s.hidden);
  return static_cast<double>(s.layers) * sum(layer_params<double>(s, 1.0)) +
         static_cast<double>(s.vocab) * h * (s.tied_head ? 1 : 2) + static_cast<double>(s.positions) * h +
         (s.rms_norm ? h : 2 * h);
}

}  // namespace

size_t TransformerShape::numel() const {
  const size_t h = hidden;
  return layers * sum(layer_params<size_t>(*this, 1)) + vocab * h * (tied_head ? 1 : 2) + positions * h +
         (rms_norm ? h : 2 * h);
}

std::string TransformerShape::summary() const {
  std::string forms;
  if (query_groups != 0 && query_groups != heads) forms += fmt::format("{} query groups, ", query_groups);
  if (swiglu) forms += "SwiGLU, ";
  if (rms_norm) forms += "RMSNorm, ";
  if (head_dim != 0) forms += fmt::format("head_dim {}, ", head_dim);
  if (!linear_bias) forms += qkv_bias ? "biases on q, k and v only, " : "no biases, ";
  if (qk_norm) forms += "q and k RMSNorm, ";
  return fmt::format("{} layers, hidden {}, {} heads, vocab {}, {}, {}{}{}", layers, hidden, heads, vocab,
                     positions == 0 ? "no position embeddings" : fmt::format("{} positions", positions),
                     ffn_hidden == 0 ? "" : fmt::format("ffn {}, ", ffn_hidden), forms,
                     tied_head ? "tied head" : "untied head");
}

void check_transformer_split(const TransformerShape& s, int tp, int pp, const TransformerNames& n) {
  ZEST_CHECK(s.layers >= 1 && s.hidden >= 1 && s.heads >= 1 && s.vocab >= 1,
             "a transformer needs {} ({}), {} ({}), {} ({}) and {} ({}) of at least 1", n.layers, s.layers, n.hidden,
             s.hidden, n.heads, s.heads, n.vocab, s.vocab);
  ZEST_CHECK(s.head_dim != 0 || s.hidden % s.heads == 0,
             "{} {} is not a multiple of {} {}: each head has hidden / heads channels", n.hidden, s.hidden, n.heads,
             s.heads);
  ZEST_CHECK(s.groups() >= 1 && s.heads % s.groups() == 0,
             "{} {} do not divide into {} {}: each key-value group serves the same number of query heads", n.heads,
             s.heads, n.groups, s.groups());
  ZEST_CHECK(numel_of(s) <= kMaxModelNumel, "the transformer ({}) has {:.3g} parameters: at most 2^48 are supported",
             s.summary(), numel_of(s));
  ZEST_CHECK(tp >= 1, "{} is {}: it must be at least 1 (the tensor-parallel ranks a layer is split over)", n.tp, tp);
  ZEST_CHECK(pp >= 1, "{} is {}: it must be at least 1 (the pipeline stages the layers are split into)", n.pp, pp);
  const auto t = static_cast<size_t>(tp);
  ZEST_CHECK(s.heads % t == 0, "{} {} does not divide the {} attention heads ({}): Megatron gives each "
             "tensor-parallel rank whole heads", n.tp, tp, s.heads, n.heads);
  ZEST_CHECK(s.groups() % t == 0, "{} {} does not divide the {} key-value groups ({}): Megatron gives each "
             "tensor-parallel rank whole groups", n.tp, tp, s.groups(), n.groups);
  ZEST_CHECK(s.vocab % t == 0, "{} {} does not divide the vocabulary of {} ({}): pad it to a multiple of {}, as "
             "Megatron does (--make-vocab-size-divisible-by)", n.tp, tp, s.vocab, n.vocab, tp);
  ZEST_CHECK(s.ffn() % t == 0, "{} {} does not divide the MLP's width {} ({}): fc1's rows are split evenly", n.tp, tp,
             s.ffn(), n.ffn);
  const auto p = static_cast<size_t>(pp);
  ZEST_CHECK(p <= s.layers, "{} {} is more than the {} layers ({}): every pipeline stage needs a layer", n.pp, pp,
             s.layers, n.layers);
  ZEST_CHECK(s.layers % p == 0, "{} {} does not divide the {} layers ({}): Megatron gives every stage the same number of layers",
             n.pp, pp, s.layers, n.layers);
}

ModelDescription transformer_stage_model(const TransformerShape& s, int tp, int pp, int stage) {
  check_transformer_split(s, tp, pp);
  ZEST_CHECK(stage >= 0 && stage < pp, "pipeline stage {} of {}: stages are 0 to {}", stage, pp, pp - 1);
  const size_t h = s.hidden, t = static_cast<size_t>(tp);
  const size_t vocab_slice = s.vocab / t * h;
  ModelDescription m;
  if (stage == 0) {
    UnitDescription emb{"embedding", {vocab_slice}, 1};
    if (s.positions > 0) emb.param_numels.push_back(s.positions * h);
    m.units.push_back(std::move(emb));
  }
  m.units.push_back({"layer", layer_params<size_t>(s, t), s.layers / static_cast<size_t>(pp)});
  if (stage == pp - 1) {
    UnitDescription head{"head", s.rms_norm ? std::vector<size_t>{h} : std::vector<size_t>{h, h}, 1};
    if (pp > 1 || !s.tied_head) head.param_numels.push_back(vocab_slice);
    m.units.push_back(std::move(head));
  }
  return m;
}

}  // namespace zest
