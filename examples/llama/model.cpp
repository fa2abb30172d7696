#include "model.h"

#include "zest/torch/module_construction.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace llama {
namespace {

zest::LoraLinear projection(int64_t in, int64_t out, bool bias) {
  return zest::LoraLinear(zest::LoraLinearOptions(in, out).bias(bias));
}

// modeling_llama.rotate_half: (x1, x2) -> (-x2, x1) over the last dim's halves.
torch::Tensor rotate_half(const torch::Tensor& x) {
  const int64_t half = x.size(-1) / 2;
  return torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
}

// repeat_kv: [B, kv, T, d] -> [B, kv * n_rep, T, d], each kv head n_rep times in a row.
torch::Tensor repeat_kv(const torch::Tensor& x, int64_t n_rep) {
  if (n_rep == 1) return x;
  const int64_t B = x.size(0), kv = x.size(1), T = x.size(2), d = x.size(3);
  return x.unsqueeze(2).expand({B, kv, n_rep, T, d}).reshape({B, kv * n_rep, T, d});
}

// HF's _init_weights on a module's parameters: Linear and Embedding weights
// N(0, std), biases 0, RMSNorm weights 1 (their names end in "norm.weight").
void init_parameters(torch::nn::Module& m, double std, at::Generator gen) {
  torch::NoGradGuard no_grad;
  for (const auto& item : m.named_parameters()) {
    torch::Tensor p = item.value();
    if (item.key().ends_with("norm.weight")) {
      p.fill_(1.0);
    } else if (item.key().ends_with(".bias") || item.key() == "bias") {
      p.zero_();
    } else {
      p.normal_(0.0, std, gen);
    }
  }
}

}  // namespace

torch::Tensor run_directly(const torch::nn::Module&, const std::function<torch::Tensor()>& piece) { return piece(); }

RMSNormImpl::RMSNormImpl(int64_t size, double eps) : eps_(eps) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x.to(torch::kFloat);
  const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  return weight * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
}

Rotary rotary(const Config& c, int64_t T, torch::ScalarType dtype, torch::Device device) {
  const std::vector<float> inv = rope_inv_freq(c);
  const torch::Tensor inv_freq = torch::tensor(inv, torch::kFloat).to(device);
  const torch::Tensor positions = torch::arange(T, torch::TensorOptions().dtype(torch::kFloat).device(device));
  // inv_freq[:, None] @ position_ids[None, :], transposed: [T, d/2], in fp32.
  const torch::Tensor freqs = torch::matmul(inv_freq.unsqueeze(1), positions.unsqueeze(0)).transpose(0, 1);
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos().to(dtype), emb.sin().to(dtype)};
}

LlamaAttentionImpl::LlamaAttentionImpl(const Config& c)
    : heads_(c.num_attention_heads), kv_heads_(c.num_key_value_heads), head_dim_(c.resolved_head_dim()) {
  const int64_t h = c.hidden_size;
  q_proj = register_module("q_proj", projection(h, heads_ * head_dim_, c.attention_bias));
  k_proj = register_module("k_proj", projection(h, kv_heads_ * head_dim_, c.attention_bias));
  v_proj = register_module("v_proj", projection(h, kv_heads_ * head_dim_, c.attention_bias));
  o_proj = register_module("o_proj", projection(heads_ * head_dim_, h, c.attention_bias));
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const Rotary& rope) {
  const int64_t B = x.size(0), T = x.size(1);
  const auto heads = [&](const torch::Tensor& t) { return t.view({B, T, -1, head_dim_}).transpose(1, 2); };
  torch::Tensor q = heads(q_proj->forward(x)), k = heads(k_proj->forward(x));
  const torch::Tensor v = heads(v_proj->forward(x));
  // apply_rotary_pos_emb: cos and sin [T, d] broadcast over batch and heads.
  q = q * rope.cos + rotate_half(q) * rope.sin;
  k = k * rope.cos + rotate_half(k) * rope.sin;
  const int64_t n_rep = heads_ / kv_heads_;
  const torch::Tensor keys = repeat_kv(k, n_rep), values = repeat_kv(v, n_rep);
  torch::Tensor scores = torch::matmul(q, keys.transpose(2, 3)) * (1.0 / std::sqrt(static_cast<double>(head_dim_)));
  // HF adds the dtype's lowest value above the diagonal; exp of it underflows
  // to 0 as exp(-inf) does, so the probabilities are the same.
  const torch::Tensor future =
      torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<float>::infinity());
  const torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  const torch::Tensor out = torch::matmul(probs, values).transpose(1, 2).contiguous().reshape({B, T, -1});
  return o_proj->forward(out);
}

LlamaMlpImpl::LlamaMlpImpl(const Config& c) {
  gate_proj = register_module("gate_proj", projection(c.hidden_size, c.intermediate_size, c.mlp_bias));
  up_proj = register_module("up_proj", projection(c.hidden_size, c.intermediate_size, c.mlp_bias));
  down_proj = register_module("down_proj", projection(c.intermediate_size, c.hidden_size, c.mlp_bias));
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  return down_proj->forward(torch::silu(gate_proj->forward(x)) * up_proj->forward(x));
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const Config& c) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", LlamaMlp(c));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const Rotary& rope) {
  const torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x), rope);
  return h + mlp->forward(post_attention_layernorm->forward(h));
}

LlamaDecoderLayer make_block(const Config& c, int64_t i, uint64_t seed) {
  LlamaDecoderLayer layer(c);
  // Seed 0 of the stream is the embeddings' and the head's (the model's).
  init_parameters(*layer, c.initializer_range,
                  at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) + 1));
  return layer;
}

LlamaModelImpl::LlamaModelImpl(const Config& c, const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                               bool placeholders) {
  embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
  if (placeholders) zest::placeholder(embed_tokens);  // before the layers: one unit's memory at a time
  layers = register_module("layers", torch::nn::ModuleList());
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) layers->push_back(make_layer(i));
  norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c, uint64_t seed)
    : LlamaForCausalLMImpl(c, seed, [&c, seed](int64_t i) { return make_block(c, i, seed); }) {}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c, uint64_t seed,
                                           const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                                           bool placeholders)
    : config_(c) {
  c.validate();
  model = register_module("model", LlamaModel(c, make_layer, placeholders));
  if (!c.tie_word_embeddings) {
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
    if (placeholders) zest::placeholder(lm_head);
  }
  if (placeholders) return;  // the values come from a checkpoint
  at::Generator gen = at::detail::createCPUGenerator(seed * 0x9E3779B97F4A7C15ull);
  init_parameters(*model->embed_tokens, c.initializer_range, gen);
  if (lm_head) init_parameters(*lm_head, c.initializer_range, gen);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens, const UnitRunner& run,
                                            const LayerRunner& run_layer) {
  const int64_t T = tokens.size(1);
  if (T > config_.max_position_embeddings) {
    throw std::invalid_argument(fmt::format("a sequence of {} tokens is longer than max_position_embeddings {}", T,
                                            config_.max_position_embeddings));
  }
  torch::Tensor x = run(embed_unit(), [&] { return model->embed_tokens->forward(tokens); });
  const Rotary rope = rotary(config_, T, x.scalar_type(), x.device());
  for (LlamaDecoderLayer layer : layers()) {
    x = run_layer ? run_layer(layer, x, rope) : run(*layer, [&] { return layer->forward(x, rope); });
  }
  x = run(*model->norm, [&] { return model->norm->forward(x); });
  return run(head_unit(), [&] {
    return lm_head ? lm_head->forward(x) : torch::matmul(x, model->embed_tokens->weight.t());
  });
}

std::vector<std::shared_ptr<torch::nn::Module>> LlamaForCausalLMImpl::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  if (lm_head) out.push_back(model->embed_tokens.ptr());
  for (const auto& layer : *model->layers) out.push_back(layer);
  out.push_back(model->norm.ptr());
  if (lm_head) out.push_back(lm_head.ptr());
  return out;
}

const torch::nn::Module& LlamaForCausalLMImpl::embed_unit() const {
  return lm_head ? static_cast<const torch::nn::Module&>(*model->embed_tokens) : *this;
}

const torch::nn::Module& LlamaForCausalLMImpl::head_unit() const {
  return lm_head ? static_cast<const torch::nn::Module&>(*lm_head) : *this;
}

std::vector<LlamaDecoderLayer> LlamaForCausalLMImpl::layers() const {
  std::vector<LlamaDecoderLayer> out;
  for (const auto& m : *model->layers) out.emplace_back(std::dynamic_pointer_cast<LlamaDecoderLayerImpl>(m));
  return out;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}).to(torch::kFloat),
                                              targets.reshape({-1}));
}

}  // namespace llama
