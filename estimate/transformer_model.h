// A GPT-style transformer as Megatron-LM splits it over tp x pp ranks: the
// units one rank of a pipeline stage holds, for the memory estimator
// (mesh_estimate.h). Megatron's GPT (megatron/core/models/gpt, with its
// defaults: learned position embeddings, LayerNorm with biases, a GELU MLP
// with biases, the output layer tied to the word embeddings):
//
//   per layer, on each tp rank (h hidden, f = ffn_hidden, t = tp):
//     input and post-attention LayerNorm   2h + 2h    whole on every tp rank
//     QKV (column-parallel)                3h·h/t + 3h/t
//     attention projection (row-parallel)  h·h/t, and its bias h whole
//     MLP fc1 (column-parallel)            f·h/t + f/t
//     MLP fc2 (row-parallel)               h·f/t, and its bias h whole
//     in all, at f = 4h: 12h²/t + 7h/t + 6h
//   first stage   the word embeddings V/t·h (vocab-parallel) and the
//                 position embeddings s·h (whole on every tp rank)
//   last stage    the final LayerNorm 2h and the output layer V/t·h: with a
//                 tied head and pp > 1 the copy of the word embeddings
//                 Megatron keeps there (summed with the first stage's
//                 gradients over the embedding group); with pp = 1 and a
//                 tied head the embeddings serve, and there is none
//   layers        layers / pp per stage, in order
//
// Llama's shape, as Megatron's Llama scripts ask for it (--swiglu
// --normalization RMSNorm --disable-bias-linear --group-query-attention
// --num-query-groups g --position-embedding-type rope
// --untie-embeddings-and-output-weights): fc1 is the gate and up
// projections fused (2f·h/t), the norms have no bias (h each), no linear
// layer has one, QKV is (h + 2g·h/heads)·h/t (g key-value groups, each of
// h/heads channels; t divides g), and there are no position embeddings:
//   per layer, on each tp rank: (h + 2g·h/heads)·h/t + h·h/t + 3f·h/t + 2h
// (Llama-2 70B: 80 layers of 855,654,400, 68,976,648,192 parameters in all,
// as Hugging Face counts them). With head_dim d given, q is heads x d wide:
// QKV (heads + 2g)·d·h/t, the projection h·heads·d/t.
//
// A rank of stage p holds the same units whatever its tp rank: the split
// parameters are sliced evenly, the rest whole.
//
//   // zest-example: run
//   zest::TransformerShape gpt{.layers = 96, .hidden = 12288, .heads = 96, .vocab = 51200, .positions = 2048};
//   zest::ModelDescription first = zest::transformer_stage_model(gpt, 8, 16, 0);
//   // 6 layers of 12h²/8 + 7h/8 + 6h, and 51200/8 x 12288 + 2048 x 12288 of embeddings
//   ZEST_CHECK(first.numel() == 1'463'270'400, "one rank of the first of 16 stages at tp 8");
#pragma once

#include <cstddef>
#include <string>

#include "zest/estimate/memory_estimate.h"

namespace zest {

struct TransformerShape {
  size_t layers = 0;
  size_t hidden = 0;
  size_t heads = 0;
  size_t vocab = 0;       // as Megatron pads it (a multiple of tp: --make-vocab-size-divisible-by)
  size_t positions = 0;   // learned position embeddings (max_position_embeddings); 0: none (rotary)
  size_t ffn_hidden = 0;  // the MLP's width; 0: 4 x hidden
  bool tied_head = true;  // the output layer shares the word embeddings (Megatron's default)
  // Llama's forms (Megatron's --swiglu, --normalization RMSNorm,
  // --disable-bias-linear, --num-query-groups).
  bool swiglu = false;       // fc1 holds the gate and up projections: 2 x ffn rows
  bool rms_norm = false;     // the norms have a weight and no bias
  bool linear_bias = true;   // the linear layers have biases
  size_t query_groups = 0;   // key-value heads (grouped-query attention); 0: heads
  // Hugging Face's forms (zest-estimate --hf-config): a head width of its own
  // (Qwen3, some Llamas: q is heads x head_dim wide, not hidden), biases on
  // q, k and v only (Qwen2), and a per-head RMSNorm of q and of k (Qwen3's
  // q_norm and k_norm, head_dim each, whole on every tp rank).
  size_t head_dim = 0;  // 0: hidden / heads
  bool qkv_bias = false;
  bool qk_norm = false;

  size_t ffn() const { return ffn_hidden == 0 ? 4 * hidden : ffn_hidden; }
  size_t groups() const { return query_groups == 0 ? heads : query_groups; }
  size_t head_width() const { return head_dim == 0 ? hidden / heads : head_dim; }
  // Every parameter of the whole model, the tied head counted once:
  // layers (12h² + 13h at f = 4h for GPT) + V·h + s·h + the final norm
  // (+ V·h untied).
  size_t numel() const;
  // "96 layers, hidden 12288, 96 heads, vocab 51200, 2048 positions, tied head"
  // (and "8 query groups, SwiGLU, RMSNorm, no biases" where they apply)
  std::string summary() const;
};

// What the checks call each size: the fields' names by default, a tool's
// flags (zest-estimate: --tp, --layers...) when it passes its own.
struct TransformerNames {
  const char* layers = "layers";
  const char* hidden = "hidden";
  const char* heads = "heads";
  const char* vocab = "vocab";
  const char* ffn = "ffn_hidden";
  const char* groups = "query_groups";
  const char* tp = "tp_size";
  const char* pp = "pp_size";
};

// Throws a zest::Error naming the size at fault unless the shape is whole
// (layers, hidden, heads, vocab >= 1; heads divide hidden unless head_dim
// is given) and tp x pp
// splits it as Megatron does: tp divides the heads (each rank keeps whole
// heads) and the query groups, the vocab and the MLP's width; pp divides the
// layers (so at most one stage per layer); the query groups divide the
// heads.
void check_transformer_split(const TransformerShape& shape, int tp, int pp, const TransformerNames& names = {});

// The units of one rank of pipeline stage `stage` (0 to pp - 1) under
// tp x pp: "embedding" (first stage), "layer" x layers / pp, "head" (last
// stage: the final LayerNorm and the output layer). Checked as above.
ModelDescription transformer_stage_model(const TransformerShape& shape, int tp, int pp, int stage);

}  // namespace zest
