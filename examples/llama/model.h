// A Llama-family decoder (Hugging Face's LlamaForCausalLM) written with
// libtorch modules: RMSNorm, rotary position embeddings, grouped-query
// attention, a SwiGLU MLP, and an untied or tied head. Parameter names and
// shapes are LlamaForCausalLM's, so a checkpoint's tensors load by name:
//
//   model.embed_tokens.weight                       [vocab, hidden]
//   model.layers.{i}.input_layernorm.weight         [hidden]
//   model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (+ .bias with attention_bias)
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
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include <torch/torch.h>

#include "config.h"
#include "zest/torch/lora.h"

namespace llama {

// How forward runs a piece that uses one unit's parameters: directly, or
// through zest::TorchModule::call (gathered at stage 3).
using UnitRunner =
    std::function<torch::Tensor(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece)>;
torch::Tensor run_directly(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece);

class RMSNormImpl : public torch::nn::Module {
 public:
  RMSNormImpl(int64_t size, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;

 private:
  double eps_;
};
TORCH_MODULE(RMSNorm);

// cos and sin, [T, head_dim], in `dtype`: positions 0..T-1.
struct Rotary {
  torch::Tensor cos, sin;
};
Rotary rotary(const Config& c, int64_t T, torch::ScalarType dtype, torch::Device device);

class LlamaAttentionImpl : public torch::nn::Module {
 public:
  explicit LlamaAttentionImpl(const Config& c);
  torch::Tensor forward(const torch::Tensor& x, const Rotary& rope);

  zest::LoraLinear q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, o_proj{nullptr};

 private:
  int64_t heads_, kv_heads_, head_dim_;
};
TORCH_MODULE(LlamaAttention);

class LlamaMlpImpl : public torch::nn::Module {
 public:
  explicit LlamaMlpImpl(const Config& c);
  torch::Tensor forward(const torch::Tensor& x);

  zest::LoraLinear gate_proj{nullptr}, up_proj{nullptr}, down_proj{nullptr};
};
TORCH_MODULE(LlamaMlp);

// h = x + self_attn(input_layernorm(x)); h + mlp(post_attention_layernorm(h)).
class LlamaDecoderLayerImpl : public torch::nn::Module {
 public:
  explicit LlamaDecoderLayerImpl(const Config& c);
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
// blocks were made before it.
LlamaDecoderLayer make_block(const Config& c, int64_t i, uint64_t seed);

// How forward runs a decoder layer, when not through the UnitRunner.
using LayerRunner = std::function<torch::Tensor(LlamaDecoderLayer layer, const torch::Tensor& x, const Rotary& rope)>;

// LlamaModel: the embeddings, the layers and the final norm.
class LlamaModelImpl : public torch::nn::Module {
 public:
  // placeholders: the embeddings made a placeholder as soon as they are
  // built (zest/torch/module_construction.h), for a checkpoint's values.
  LlamaModelImpl(const Config& c, const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                 bool placeholders = false);

  torch::nn::Embedding embed_tokens{nullptr};
  torch::nn::ModuleList layers{nullptr};
  RMSNorm norm{nullptr};
};
TORCH_MODULE(LlamaModel);

class LlamaForCausalLMImpl : public torch::nn::Module {
 public:
  // Blocks from make_block(c, i, seed); the embeddings and the head drawn
  // from the seed too.
  LlamaForCausalLMImpl(const Config& c, uint64_t seed);
  // Blocks from `make_layer`; the embeddings and head from the seed, or
  // with `placeholders` made placeholders as soon as each is built (deferred
  // construction, for a checkpoint's values: make_layer then returns
  // placeholder blocks too), so no more than one unit is ever held whole.
  LlamaForCausalLMImpl(const Config& c, uint64_t seed, const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                       bool placeholders = false);

  // tokens [B, T] int64 -> logits [B, T, vocab] in the parameters' dtype.
  // The embedding runs as run(embed_unit(), ...), each layer as
  // run(layer, ...), the final norm as run(*model->norm, ...) and the head
  // as run(head_unit(), ...).
  // run_layer, when given, runs each decoder layer instead (activation
  // checkpointing: zt.checkpoint_call).
  torch::Tensor forward(const torch::Tensor& tokens, const UnitRunner& run = run_directly,
                        const LayerRunner& run_layer = {});

  const Config& config() const { return config_; }
  // The units for zest::TorchModuleOptions::units: each layer, the final
  // norm, and untied the embeddings and the head (tied, those two share
  // the root's unit, "<root>").
  std::vector<std::shared_ptr<torch::nn::Module>> units() const;
  const torch::nn::Module& embed_unit() const;
  const torch::nn::Module& head_unit() const;
  std::vector<LlamaDecoderLayer> layers() const;

  LlamaModel model{nullptr};
  torch::nn::Linear lm_head{nullptr};  // untied only

 private:
  Config config_;
};
TORCH_MODULE(LlamaForCausalLM);

// Mean cross-entropy of logits [B, T, vocab] (any dtype: computed in fp32,
// as HF's loss upcasts) against targets [B, T].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace llama
