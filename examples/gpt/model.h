// A GPT-2-style decoder-only transformer written with libtorch modules:
// token and position embeddings, pre-norm blocks (causal self-attention,
// then an MLP with GELU), a final LayerNorm and an output head, tied to the
// token embedding or not.
//
//   gpt::Config c{.vocab = 256, .context = 64, .layers = 4, .heads = 4, .d_model = 128};
//   gpt::Gpt model(c, /*seed=*/1234);
//   torch::Tensor logits = model->forward(tokens);   // [B, T] int64 -> [B, T, vocab]
//
// Parameter names follow GPT-2's (wte, wpe, h.0.attn.c_attn, ..., ln_f), so
// an exported safetensors file reads like a GPT-2 state dict (torch's Linear
// keeps [out, in] weights where GPT-2's Conv1D keeps [in, out]). The
// projections are zest::LoraLinear, torch::nn::Linear until adapters are
// enabled (--lora). There is
// no dropout: a step is a deterministic function of the parameters and the
// batch, which is what lets ZeRO's stages be compared bit for bit.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "zest/torch/lora.h"

namespace gpt {

struct Config {
  int64_t vocab = 256;   // byte-level: every byte is a token
  int64_t context = 64;  // the longest sequence (position embeddings)
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t d_model = 128;
  bool tied_head = true;  // the head's weight is wte's

  // Throws std::invalid_argument naming the field when a size is not
  // positive or d_model does not divide into heads.
  void validate() const;
  // Every parameter, counting a tied head once: 124,439,808 for GPT-2 small
  // (vocab 50257, context 1024, 12 layers, 12 heads, d_model 768, tied).
  int64_t parameters() const;
  std::string str() const;  // "4 layers, 4 heads, d_model 128, context 64, vocab 256, tied head"

  // config.json for a Hugging Face directory of this model, in GPT2Config's
  // key names (n_layer, n_head, n_embd, n_positions, vocab_size,
  // tie_word_embeddings) with torch_dtype; model_type "zest_gpt", since the
  // weights keep this model's names and torch's [out, in] layout rather
  // than GPT-2's Conv1D [in, out]. from_json_file reads it back, with its
  // torch_dtype (bfloat16 when absent) into `torch_dtype` when given;
  // throws std::invalid_argument naming the key.
  std::string to_json(const std::string& torch_dtype) const;
  static Config from_json_file(const std::string& path, std::string* torch_dtype = nullptr);
};

// The projections LoRA adapts (--lora): attention's c_attn and c_proj, the
// MLP's c_fc and c_proj.
std::vector<std::string> lora_targets();

// How forward runs a piece of itself that uses one unit's parameters (a
// block, or the embeddings and head, which belong to the model itself):
// directly for plain libtorch; through zest::TorchModule::call under ZEST,
// which gathers the unit (stage 3) and arranges its re-gather in backward.
using UnitRunner =
    std::function<torch::Tensor(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece)>;
torch::Tensor run_directly(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece);

// Causal multi-head self-attention with plain matmuls and softmax
// (libtorch 1.13 has no scaled_dot_product_attention).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  explicit CausalSelfAttentionImpl(const Config& c);
  torch::Tensor forward(const torch::Tensor& x);

  zest::LoraLinear c_attn{nullptr};  // d -> 3d: queries, keys, values
  zest::LoraLinear c_proj{nullptr};  // d -> d

 private:
  int64_t heads_;
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const Config& c);
  torch::Tensor forward(const torch::Tensor& x);

  zest::LoraLinear c_fc{nullptr};    // d -> 4d
  zest::LoraLinear c_proj{nullptr};  // 4d -> d
};
TORCH_MODULE(Mlp);

// x + attn(ln_1(x)), then + mlp(ln_2(.)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Config& c);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module {
 public:
  // Initialized as GPT-2 is: weights N(0, 0.02), the residual projections
  // (c_proj) N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorms 1 and 0;
  // from a generator of its own seeded with `seed`, so that models built
  // at once on several threads get the same values.
  GptImpl(const Config& c, uint64_t seed);

  // tokens: [B, T] int64 with T <= context. Returns logits [B, T, vocab].
  // Each block runs as run(block, ...); the embeddings and the head, whose
  // parameters are the model's own (the tied head uses wte), as
  // run(*this, ...).
  torch::Tensor forward(const torch::Tensor& tokens, const UnitRunner& run = run_directly);

  const Config& config() const { return config_; }
  // The blocks, for zest::TorchModuleOptions::units.
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleList h{nullptr};  // the blocks, each a Block
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // untied only (null when tied)

 private:
  torch::Tensor embed(const torch::Tensor& tokens);
  torch::Tensor head(const torch::Tensor& x);

  Config config_;
};
TORCH_MODULE(Gpt);

// Mean cross-entropy of logits [B, T, vocab] against targets [B, T].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace gpt
