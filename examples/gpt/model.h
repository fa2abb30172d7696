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
//
// A Placement builds one rank's part of the model instead (common/
// mesh_trainer.h trains it through examples::StagedLm): the layers split
// over a tensor-parallel group as Megatron-LM splits GPT (the token
// embedding and the head by vocabulary, c_attn and c_fc by output rows,
// c_attn's queries, keys and values each by heads, the c_projs by input
// columns; LayerNorms, wpe and the c_projs' biases whole),
// and the blocks cut into consecutive pipeline stages, the embeddings on the
// first, ln_f and the head on the last. Every part starts from the values of
// the whole model with the same seed, under the whole model's names.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <torch/torch.h>

#include "common/staged_lm.h"
#include "zest/comm/communicator.h"
#include "zest/torch/lora.h"
#include "zest/torch/tensor_parallel.h"

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

// Which part of the model a rank builds (common/staged_lm.h).
using Placement = examples::Placement;
// Throws std::invalid_argument naming the sizes when tp does not divide
// the heads and the vocabulary, or there are more stages than layers.
void validate(const Placement& placement, const Config& c);

// Tensor-parallel rank tp_rank's part (of tp_size) of the whole model's
// parameter `name` (its GPT-2 name, as the whole model has it), as
// zest::tp's layers split it.
torch::Tensor part_of_whole(const std::string& name, const torch::Tensor& whole, int tp_rank, int tp_size);

// The projections LoRA adapts (--lora): attention's c_attn and c_proj, the
// MLP's c_fc and c_proj.
std::vector<std::string> lora_targets();

// How forward runs a piece of itself that uses one unit's parameters (a
// block, or the embeddings and head, which belong to the model itself):
// directly for plain libtorch; through zest::TorchModule::call under ZEST,
// which gathers the unit (stage 3) and arranges its re-gather in backward.
using UnitRunner = examples::UnitRunner;
torch::Tensor run_directly(const torch::nn::Module& unit, const std::function<torch::Tensor()>& piece);

// Causal multi-head self-attention with plain matmuls and softmax
// (libtorch 1.13 has no scaled_dot_product_attention).
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  // With a tensor-parallel group `tp`: heads / tp heads on this rank.
  explicit CausalSelfAttentionImpl(const Config& c, zest::Communicator* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  zest::LoraLinear c_attn{nullptr};  // d -> 3d: queries, keys, values
  zest::LoraLinear c_proj{nullptr};  // d -> d
  // Under tensor parallelism instead, with the same names.
  zest::tp::ColumnParallelLinear c_attn_tp{nullptr};  // stride 3: this rank's heads of q, k and v
  zest::tp::RowParallelLinear c_proj_tp{nullptr};

 private:
  int64_t heads_;  // this rank's
};
TORCH_MODULE(CausalSelfAttention);

class MlpImpl : public torch::nn::Module {
 public:
  explicit MlpImpl(const Config& c, zest::Communicator* tp = nullptr);
  torch::Tensor forward(const torch::Tensor& x);

  zest::LoraLinear c_fc{nullptr};    // d -> 4d
  zest::LoraLinear c_proj{nullptr};  // 4d -> d
  zest::tp::ColumnParallelLinear c_fc_tp{nullptr};  // under tensor parallelism instead
  zest::tp::RowParallelLinear c_proj_tp{nullptr};
};
TORCH_MODULE(Mlp);

// x + attn(ln_1(x)), then + mlp(ln_2(.)).
class BlockImpl : public torch::nn::Module {
 public:
  explicit BlockImpl(const Config& c, zest::Communicator* tp = nullptr);
  torch::Tensor forward(torch::Tensor x);

  torch::nn::LayerNorm ln_1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln_2{nullptr};
  Mlp mlp{nullptr};
};
TORCH_MODULE(Block);

class GptImpl : public torch::nn::Module, public examples::StagedLm {
 public:
  // Initialized as GPT-2 is: weights N(0, 0.02), the residual projections
  // (c_proj) N(0, 0.02 / sqrt(2 layers)), biases 0, LayerNorms 1 and 0;
  // from a generator of its own seeded with `seed`, so that models built
  // at once on several threads get the same values.
  GptImpl(const Config& c, uint64_t seed, Placement placement = {});

  // tokens: [B, T] int64 with T <= context. Returns logits [B, T, vocab].
  // Each block runs as run(block, ...); the embeddings and the head, whose
  // parameters are the model's own (the tied head uses wte), as
  // run(*this, ...). The whole model only (one stage; under tensor
  // parallelism the logits are this rank's vocabulary slice).
  torch::Tensor forward(const torch::Tensor& tokens, const UnitRunner& run = run_directly);
  // This stage's part of forward: the first stage takes tokens [B, T], the
  // others the previous stage's output [B, T, d_model]; the last returns
  // logits [B, T, vocab / tp] (this rank's slice), the others [B, T, d].
  torch::Tensor forward_stage(const torch::Tensor& input, const UnitRunner& run = run_directly) override;
  // The mean (loss) or the sum (loss_sum) of the token losses of the last
  // stage's logits against targets [B, T]: vocabulary-parallel
  // cross-entropy under tensor parallelism, the same on every tp rank.
  torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) override;
  torch::Tensor loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) override;
  // The whole vocabulary's logits from this rank's slice (tp ranks gather).
  torch::Tensor whole_logits(const torch::Tensor& logits) override;

  // A tied head across pipeline stages (torch/pipeline_stage.h): the first
  // stage passes the embedding's output through `tie` (PipelineStage::tied);
  // the last stage's head uses `weight`, the copy of wte's (tie_last).
  void set_embedding_tie(std::function<torch::Tensor(const torch::Tensor&)> tie) override { tie_ = std::move(tie); }
  void set_head_weight(torch::Tensor weight) override { head_weight_ = std::move(weight); }
  // wte's weight (the first stage's; under tp this rank's rows), in the
  // model's own unit.
  const torch::Tensor& embedding_weight() const override;
  const torch::nn::Module& embedding_unit() const override { return *this; }

  const Config& config() const { return config_; }
  const Placement& placement() const override { return placement_; }
  int64_t hidden_size() const override { return config_.d_model; }
  int64_t vocab_size() const override { return config_.vocab; }
  bool tied_head() const override { return config_.tied_head; }
  torch::ScalarType activation_dtype() const override;
  // The blocks, for zest::TorchModuleOptions::units.
  std::vector<std::shared_ptr<torch::nn::Module>> blocks() const;

  // Null where this rank does not hold them (another stage's, or the
  // tensor-parallel form in the *_tp member instead).
  torch::nn::Embedding wte{nullptr};
  zest::tp::VocabParallelEmbedding wte_tp{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::ModuleDict h{nullptr};  // this stage's blocks, each a Block, keyed by layer number
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // untied only (null when tied)
  zest::tp::ColumnParallelLinear lm_head_tp{nullptr};

 private:
  torch::Tensor embed(const torch::Tensor& tokens);
  torch::Tensor head(const torch::Tensor& x);
  void initialize(uint64_t seed);

  Config config_;
  Placement placement_;
  std::function<torch::Tensor(const torch::Tensor&)> tie_;
  torch::Tensor head_weight_;
};
TORCH_MODULE(Gpt);

// Mean cross-entropy of logits [B, T, vocab] against targets [B, T].
torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets);

}  // namespace gpt
