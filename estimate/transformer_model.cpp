#include "zest/estimate/transformer_model.h"

#include <fmt/format.h>

#include "zest/core/check.h"

namespace zest {
namespace {

// The estimator keeps counts below 2^48 (model_description.cpp); checked in
// doubles before any product is formed in size_t.
constexpr double kMaxNumel = static_cast<double>(size_t{1} << 48);

double numel_of(const TransformerShape& s) {
  const double h = static_cast<double>(s.hidden), f = static_cast<double>(s.ffn());
  const double layer = 4 * h * h + 2 * h * f + 9 * h + f;
  return static_cast<double>(s.layers) * layer + static_cast<double>(s.vocab) * h * (s.tied_head ? 1 : 2) +
         static_cast<double>(s.positions) * h + 2 * h;
}

}  // namespace

size_t TransformerShape::numel() const {
  const size_t h = hidden, f = ffn();
  const size_t layer = 4 * h * h + 2 * h * f + 9 * h + f;
  return layers * layer + vocab * h * (tied_head ? 1 : 2) + positions * h + 2 * h;
}

std::string TransformerShape::summary() const {
  return fmt::format("{} layers, hidden {}, {} heads, vocab {}, {}, {}{}", layers, hidden, heads, vocab,
                     positions == 0 ? "no position embeddings" : fmt::format("{} positions", positions),
                     ffn_hidden == 0 ? "" : fmt::format("ffn {}, ", ffn_hidden),
                     tied_head ? "tied head" : "untied head");
}

void check_transformer_split(const TransformerShape& s, int tp, int pp, const TransformerNames& n) {
  ZEST_CHECK(s.layers >= 1 && s.hidden >= 1 && s.heads >= 1 && s.vocab >= 1,
             "a transformer needs {} ({}), {} ({}), {} ({}) and {} ({}) of at least 1", n.layers, s.layers, n.hidden,
             s.hidden, n.heads, s.heads, n.vocab, s.vocab);
  ZEST_CHECK(s.hidden % s.heads == 0, "{} {} is not a multiple of {} {}: each head has hidden / heads channels",
             n.hidden, s.hidden, n.heads, s.heads);
  ZEST_CHECK(numel_of(s) <= kMaxNumel, "the transformer ({}) has {:.3g} parameters: at most 2^48 are supported",
             s.summary(), numel_of(s));
  ZEST_CHECK(tp >= 1, "{} is {}: it must be at least 1 (the tensor-parallel ranks a layer is split over)", n.tp, tp);
  ZEST_CHECK(pp >= 1, "{} is {}: it must be at least 1 (the pipeline stages the layers are split into)", n.pp, pp);
  const auto t = static_cast<size_t>(tp);
  ZEST_CHECK(s.heads % t == 0, "{} {} does not divide the {} attention heads ({}): Megatron gives each "
             "tensor-parallel rank whole heads", n.tp, tp, s.heads, n.heads);
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
  const size_t h = s.hidden, f = s.ffn(), t = static_cast<size_t>(tp);
  const size_t vocab_slice = s.vocab / t * h;
  ModelDescription m;
  if (stage == 0) {
    UnitDescription emb{"embedding", {vocab_slice}, 1};
    if (s.positions > 0) emb.param_numels.push_back(s.positions * h);
    m.units.push_back(std::move(emb));
  }
  // Megatron's order within a layer (ParallelTransformerLayer): norm, QKV,
  // projection, norm, fc1, fc2, each weight before its bias.
  m.units.push_back({"layer",
                     {h, h, 3 * h * h / t, 3 * h / t, h * h / t, h, h, h, f * h / t, f / t, h * f / t, h},
                     s.layers / static_cast<size_t>(pp)});
  if (stage == pp - 1) {
    UnitDescription head{"head", {h, h}, 1};
    if (pp > 1 || !s.tied_head) head.param_numels.push_back(vocab_slice);
    m.units.push_back(std::move(head));
  }
  return m;
}

}  // namespace zest
