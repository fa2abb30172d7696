// A Llama-family decoder (Hugging Face's LlamaForCausalLM) written with
// libtorch modules: RMSNorm, rotary position embeddings, grouped-query
// attention, a SwiGLU MLP, and an untied or tied head. Parameter names and
// shapes are LlamaForCausalLM's, so a checkpoint's tensors load by name:
//
//   model.embed_tokens.weight                       [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight         [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias: config.h's family)
//   model.layers.{i}.self_attn.{q,k}_norm.weight   [head_dim], qwen3 only
//   model.layers.{i}.post_attention_layernorm.weight
//   model.layers.{i}.mlp.{gate,up,down}_proj.weight (+ .bias with mlp_bias)
//   model.norm.weight                               [hidden]
//   lm_head.weight                                  [vocab, hidden], untied only
//
// The arithmetic is modeling_llama.py's (eager attention): RMSNorm in fp32,
// then weight * x cast back; rotate_half RoPE with cos and sin computed in
// fp32 and cast to the activations' dtype; keys and values repeated for
// GQA; causal softmax in fp32; down(silu(gate(x)) * up(x)). The projections
// are zest::LoraLinear, so adapters can be enabled on them (--lora). There
// is no dropout (attention_dropout is 0 in every released config).
//
//   llama::Config c;                                  // the example's small sizes
//   llama::LlamaForCausalLM model(c, /*seed=*/1);
//   torch::Tensor logits = model->forward(tokens);    // [B, T] int64 -> [B, T, vocab]
//
// Blocks are made by a factory, make_block(i), so a caller can build (and
// fill) them one at a time, or hand the model blocks made elsewhere.
//
// A Placement (common/staged_lm.h) builds one rank's part of the model
// instead, for a device mesh (common/mesh_trainer.h trains it): each layer
// split over a tensor-parallel group as Megatron-LM splits Llama (the
// embeddings and an untied head by vocabulary; q_proj by heads and k_proj and
// v_proj by key-value heads, so each rank keeps the kv heads its query heads
// read; gate_proj and up_proj by rows; o_proj and down_proj by columns; the
// RMSNorms and the row-parallel biases whole), and the layers cut into
// consecutive pipeline stages, the embeddings on the first, the final norm
// and the head on the last. Every part starts from the whole model's values
// for the seed, under the whole model's names.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "common/staged_lm.h"
#include "config.h"
#include "rope.h"
#include "zest/comm/communicator.h"
#include "zest/torch/lora.h"
#include "zest/torch/tensor_parallel.h"

namespace llama {

// How forward runs a piece that uses one unit's parameters: directly, or
// through zest::TorchModule::call (gathered at stage 3).
using UnitRunner = examples::UnitRunner;
torch::Tensor run_directly(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece);

// Which part of the model a rank builds (common/staged_lm.h).
using Placement = examples::Placement;
// Throws std::invalid_argument naming the sizes when tp does not divide the
// heads, the key-value heads, intermediate_size and the vocabulary, or
// there are more stages than layers.
void validate(const Placement& placement, const Config& c);

// Tensor-parallel rank tp_rank's part (of tp_size) of the whole model's
// parameter `name` (its LlamaForCausalLM name, or a decoder layer's own
// name), as the split layers hold it.
torch::Tensor part_of_whole(const std::string& name, const torch::Tensor& whole, int tp_rank, int tp_size);

class RMSNormImpl : public torch::nn::Module {
 public:
  // grad_allreduce: a norm of each tensor-parallel rank's own heads (qwen3's
  // q_norm and k_norm): its weight, the same on every rank, passes through
  // zest::tp::copy_to_region, so its gradient (this rank's heads' part) is
  // summed over the group, as transformers' "replicated_with_grad_allreduce".
  RMSNormImpl(int64_t size, double eps, zest::Communicator* grad_allreduce = nullptr);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
  zest::Communicator* grad_allreduce_;
};
TORCH_MODULE(RMSNorm);

// Where the tokens are, for attention: cos and sin of their positions, in
// `dtype`, [T, head_dim] for positions 0..T-1 of every row, or
// [B, 1, T, head_dim] for each row's own position ids (packed rows); and for
// packed rows `blocked` [B, 1, T, T], true where a query may not see a key
// (a later token, or another document: block-diagonal causal attention).
// Undefined `blocked`: the causal mask.
//
// With tiles (set_tiles) the masks are never built whole: attention takes
// the document ids and the window and computes each tile's mask
// (torch/tiled_attention.h), and the MLP runs `mlp_tile` tokens at a time
// (torch/tiled_forward.h).
struct Rotary {
  torch::Tensor cos, sin;
  torch::Tensor blocked;
  int64_t attention_tile = 0;  // > 0: tiled attention
  int64_t mlp_tile = 0;        // > 0: the MLP in tiles of the sequence
  torch::Tensor documents = {};  // tiled attention of packed rows: [B, T]
  int64_t sliding_window = 0;  // tiled attention: mistral's window
};
// rope_len: dynamic scaling's length (rope_dynamic_length); 0 otherwise.
// masks false: no [T, T] mask is built (tiled attention computes its own).
Rotary rotary(const Config& c, int64_t T, torch::ScalarType dtype, torch::Device device, int64_t rope_len = 0,
              bool masks = true);
// Packed rows (data/packed_rows.h): positions and document ids [B, T] int64,
// on the model's device. As transformers computes the rotary tables of
// position_ids (in fp32: inv_freq times each position).
Rotary rotary(const Config& c, const torch::Tensor& positions, const torch::Tensor& documents,
              torch::ScalarType dtype, int64_t rope_len = 0, bool masks = true);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  // With a tensor-parallel group `tp`: heads / tp query heads and
  // kv_heads / tp key-value heads on this rank.
  explicit LlamaAttentionImpl(const Config& c, zest::Communicator* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope);

  zest::LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};
  // Under tensor parallelism instead, with the same names.
  zest::tp::ColumnParallelLinear q_proj_tp{nullptr}, k_proj_tp{nullptr}, v_proj_tp{nullptr};
  zest::tp::RowParallelLinear o_proj_tp{nullptr};
  RMSNorm q_norm{nullptr}, k_norm{nullptr};  // qwen3's, over each head's head_dim values

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const Config& c, zest::Communicator* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  zest::LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
  zest::tp::ColumnParallelLinear gate_proj_tp{nullptr}, up_proj_tp{nullptr};  // under tensor parallelism instead
  zest::tp::RowParallelLinear down_proj_tp{nullptr};
};
TORCH_MODULE(LlamaMlp);

// h = x + self_attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h)).
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const Config& c, zest::Communicator* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope);

  RMSNorm input_layernorm{nullptr};
  LlamaAttention self_attn{nullptr};
  RMSNorm post_attention_layernorm{nullptr};
  LlamaMlp mlp{nullptr};
};
TORCH_MODULE(LlamaDecoderLayer);

// Decoder layer i with its initial values: HF's _init_weights (Linear
// weights N(0, initializer_range), biases 0, norms 1) from a generator of
// its own, seeded by (seed, i), so a block's values do not depend on which
// blocks were made before it. With a tensor-parallel group `tp`, this
// rank's part of that layer (drawn whole, then split).
LlamaDecoderLayer make_block(const Config& c, int64_t i, uint64_t seed, zest::Communicator* tp = nullptr);

// How forward runs a decoder layer, when not through the UnitRunner.
using LayerRunner = std::function<torch::Tensor(LlamaDecoderLayer layer, const torch::Tensor& x, const Rotary& rope)>;

// LlamaModel: the embeddings, the layers and the final norm (those of the
// placement's stage: null where another stage holds them).
class LlamaModelImpl : public torch::nn::Module {
 public:
  // placeholders: the embeddings made a placeholder as soon as they are
  // built (zest/torch/module_construction.h), for a checkpoint's values;
  // make_layer(i) is called for this stage's layers only.
  LlamaModelImpl(const Config& c, const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                 bool placeholders = false, const Placement& placement = {});

  torch::nn::Embedding embed_tokens{nullptr};
  zest::tp::VocabParallelEmbedding embed_tokens_tp{nullptr};  // under tensor parallelism instead
  torch::nn::ModuleDict layers{nullptr};  // this stage's decoder layers, keyed by layer number
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module, public examples::StagedLm {
 public:
  // Blocks from make_block(c, i, seed); the embeddings and the head drawn
  // from the seed too. With a placement, this rank's part of each.
  LlamaForCausalLMImpl(const Config& c, uint64_t seed, const Placement& placement = {});
  // Blocks from `make_layer`; the embeddings and head from the seed, or
  // with `placeholders` made placeholders as soon as each is built (deferred
  // construction, for a checkpoint's values: make_layer then returns
  // placeholder blocks too), so no more than one unit is ever held whole.
  // make_layer(i) is called for the placement's layers only.
  LlamaForCausalLMImpl(const Config& c, uint64_t seed, const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                       bool placeholders = false, const Placement& placement = {});

  // tokens [B, T] int64 -> logits [B, T, vocab] in the parameters' dtype.
  // The embedding runs as run(embed_unit(), ...), each layer as
  // run(layer, ...), the final norm as run(*model->norm, ...) and the head
  // as run(head_unit(), ...).
  // run_layer, when given, runs each decoder layer instead (activation
  // checkpointing: zt.checkpoint_call). The whole model only (one stage;
  // under tensor parallelism the logits are this rank's vocabulary slice).
  torch::Tensor forward(const torch::Tensor& tokens, const UnitRunner& run = run_directly,
                        const LayerRunner& run_layer = {});
  // This stage's part of forward (common/staged_lm.h), each decoder layer
  // through the runner of set_layer_runner when one is set.
  torch::Tensor forward_stage(const torch::Tensor& input, const UnitRunner& run = run_directly) override;
  void set_layer_runner(LayerRunner run_layer) { layer_runner_ = std::move(run_layer); }
  // The next forwards' rows are packed: common/staged_lm.h.
  void set_packing(torch::Tensor positions, torch::Tensor documents) override;
  // tokens > 0: the head and its loss in chunks of that many tokens
  // (zest/torch/chunked_loss.h): the last stage's forward returns the final
  // norm's output [B, T, hidden] instead of logits, and loss()/loss_sum()
  // compute the head from it chunk by chunk (through the unit runner of
  // that forward), never holding [B, T, vocab]; whole_logits is refused.
  // Not under tensor parallelism (its head is split by vocabulary). 0: the
  // whole logits.
  void set_loss_chunk(int64_t tokens);
  // Attention in tiles of `attention` queries and keys, the MLP in tiles of
  // `mlp` tokens (0: whole), so that neither holds [T, T] scores nor a
  // [T, intermediate] activation (ALST's tiled attention and TiledMLP).
  void set_tiles(int64_t attention, int64_t mlp);
  // In fp32, as HF's loss upcasts the logits.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor whole_logits(const torch::Tensor& logits) override;

  // A head tied across pipeline stages (common/staged_lm.h).
  const torch::Tensor& embedding_weight() const override;
  const torch::nn::Module& embedding_unit() const override { return embed_unit(); }
  void set_embedding_tie(std::function<torch::Tensor(const torch::Tensor&)> tie) override { tie_ = std::move(tie); }
  void set_head_weight(torch::Tensor weight) override { head_weight_ = std::move(weight); }

  const Config& config() const { return config_; }
  const Placement& placement() const override { return placement_; }
  int64_t hidden_size() const override { return config_.hidden_size; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  bool tied_head() const override { return config_.tie_word_embeddings; }
  torch::ScalarType activation_dtype() const override;
  // The units for zest::TorchModuleOptions::units: each layer, the final
  // norm, and untied the embeddings and the head (tied, those two share
  // the root's unit, "<root>").
  std::vector<std::shared_ptr<torch::nn::Module>> units() const;
  const torch::nn::Module& embed_unit() const;
  const torch::nn::Module& head_unit() const;
  std::vector<LlamaDecoderLayer> layers() const;

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // untied only, on the last stage
  zest::tp::ColumnParallelLinear lm_head_tp{nullptr};  // under tensor parallelism instead

 private:
  torch::Tensor forward_part(const torch::Tensor& input, const UnitRunner& run, const LayerRunner& run_layer);
  torch::Tensor embed(const torch::Tensor& tokens);
  torch::Tensor head(const torch::Tensor& x);
  // The embeddings and the head drawn whole from the seed, this rank's
  // parts kept.
  void initialize(uint64_t seed);

  Config config_;
  Placement placement_;
  LayerRunner layer_runner_;
  torch::Tensor positions_, documents_;  // set_packing's; undefined: unpacked rows
  int64_t rope_cached_len_;              // dynamic scaling's (rope_dynamic_length)
  int64_t loss_chunk_ = 0;
  int64_t attention_tile_ = 0, mlp_tile_ = 0;
  UnitRunner head_runner_;  // the last forward's, for a chunked loss
  std::function<torch::Tensor(const torch::Tensor&)> tie_;
  torch::Tensor head_weight_;
};
TORCH_MODULE(LlamaForCausalLM);

// Mean cross-entropy of logits [B, T, vocab] (any dtype: computed in fp32,
// as HF's loss upcasts) against targets [B, T].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace llama
