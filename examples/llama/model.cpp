#include "model.h"

#include "common/projection.h"
#include "common/vocab_head.h"

#include "zest/torch/chunked_loss.h"
#include "zest/torch/tiled_attention.h"
#include "zest/torch/tiled_forward.h"
#include "zest/torch/module_construction.h"

#include <cmath>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

namespace llama {
namespace {

int tp_size_of(zest::Communicator* tp) { return tp != nullptr ? tp->size() : 1; }

constexpr uint64_t kSeedStride = 0x9E3779B97F4A7C15ull;

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

void validate(const Placement& placement, const Config& c) {
  const int t = placement.tp_size();
  if (c.num_attention_heads % t != 0 || c.num_key_value_heads % t != 0 || c.intermediate_size % t != 0 ||
      c.vocab_size % t != 0) {
    throw std::invalid_argument(fmt::format(
        "tensor parallelism over {} ranks splits the {} heads, the {} key-value heads, intermediate_size {} and the "
        "vocabulary of {} evenly: pick a tp size dividing all four",
        t, c.num_attention_heads, c.num_key_value_heads, c.intermediate_size, c.vocab_size));
  }
  placement.validate_stages(c.num_hidden_layers);
}

torch::Tensor part_of_whole(const std::string& name, const torch::Tensor& whole, int tp_rank, int tp_size) {
  if (tp_size == 1) return whole;
  const auto in = [&](const char* projection) { return name.find(projection) != std::string::npos; };
  const auto rows = [&] { return zest::tp::partition(whole, 0, tp_rank, tp_size); };
  const auto columns = [&] { return zest::tp::partition(whole, 1, tp_rank, tp_size); };
  if (name.ends_with("embed_tokens.weight") || name == "lm_head.weight") return rows();  // the vocabulary's
  // Column-parallel: rows (output features) of the weight, the bias and
  // the adapter B; the adapter A whole (tensor_parallel.h).
  if (in("q_proj.") || in("k_proj.") || in("v_proj.") || in("gate_proj.") || in("up_proj.")) {
    return name.ends_with("lora_A.weight") ? whole : rows();
  }
  // Row-parallel: columns (input features) of the weight and the adapter A;
  // the bias and the adapter B whole.
  if (in("o_proj.") || in("down_proj.")) {
    return name.ends_with(".bias") || name.ends_with("lora_B.weight") ? whole : columns();
  }
  return whole;  // the RMSNorms
}

RMSNormImpl::RMSNormImpl(int64_t size, double eps, zest::Communicator* grad_allreduce)
    : eps_(eps), grad_allreduce_(grad_allreduce) {
  weight = register_parameter("weight", torch::ones({size}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  const torch::Tensor h = x.to(torch::kFloat);
  const torch::Tensor variance = h.pow(2).mean(-1, /*keepdim=*/true);
  const torch::Tensor w = grad_allreduce_ != nullptr ? zest::tp::copy_to_region(weight, *grad_allreduce_) : weight;
  return w * (h * torch::rsqrt(variance + eps_)).to(x.scalar_type());
}

namespace {

// [T, T], true where query i may not see key j: j > i, and with mistral's
// sliding window i - j >= sliding_window (transformers'
// sliding_window_causal_mask_function).
torch::Tensor blocked_keys(const Config& c, int64_t T, torch::Device device) {
  const torch::TensorOptions opts = torch::TensorOptions().dtype(torch::kBool).device(device);
  torch::Tensor blocked = torch::ones({T, T}, opts).triu(1);
  if (c.sliding_window > 0) blocked = blocked | torch::ones({T, T}, opts).tril(-c.sliding_window);
  return blocked;
}

}  // namespace

namespace {

// cos and sin of emb times the scaling (yarn's attention factor; 1 for the
// others, an exact no-op), in fp32 as transformers computes them, then cast.
std::pair<torch::Tensor, torch::Tensor> cos_sin(const Config& c, const torch::Tensor& emb, torch::ScalarType dtype) {
  const double scaling = rope_attention_scaling(c);
  if (scaling == 1.0) return {emb.cos().to(dtype), emb.sin().to(dtype)};
  const float f = static_cast<float>(scaling);
  return {(emb.cos() * f).to(dtype), (emb.sin() * f).to(dtype)};
}

}  // namespace

Rotary rotary(const Config& c, int64_t T, torch::ScalarType dtype, torch::Device device, int64_t rope_len,
              bool masks) {
  const std::vector<float> inv = rope_inv_freq(c, rope_len);
  const torch::Tensor inv_freq = torch::tensor(inv, torch::kFloat).to(device);
  const torch::Tensor positions = torch::arange(T, torch::TensorOptions().dtype(torch::kFloat).device(device));
  // inv_freq[:, None] @ position_ids[None, :], transposed: [T, d/2], in fp32.
  const torch::Tensor freqs = torch::matmul(inv_freq.unsqueeze(1), positions.unsqueeze(0)).transpose(0, 1);
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  auto [cos, sin] = cos_sin(c, emb, dtype);
  return {cos, sin, c.sliding_window > 0 && masks ? blocked_keys(c, T, device) : torch::Tensor()};
}

Rotary rotary(const Config& c, const torch::Tensor& positions, const torch::Tensor& documents,
              torch::ScalarType dtype, int64_t rope_len, bool masks) {
  const std::vector<float> inv = rope_inv_freq(c, rope_len);
  const torch::Tensor inv_freq = torch::tensor(inv, torch::kFloat).to(positions.device());
  // inv_freq[None, :, None] @ position_ids[:, None, :], transposed: [B, T, d/2].
  const torch::Tensor freqs =
      torch::matmul(inv_freq.view({1, -1, 1}), positions.to(torch::kFloat).unsqueeze(1)).transpose(1, 2);
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);  // [B, 1, T, d]
  const int64_t T = positions.size(1);
  auto [cos, sin] = cos_sin(c, emb, dtype);
  if (!masks) return {cos, sin, torch::Tensor()};
  const torch::Tensor other_document = documents.unsqueeze(2) != documents.unsqueeze(1);  // [B, T, T]
  return {cos, sin, (other_document | blocked_keys(c, T, positions.device())).unsqueeze(1)};
}

LlamaAttentionImpl::LlamaAttentionImpl(const Config& c, zest::Communicator* tp)
    : heads_(c.num_attention_heads / tp_size_of(tp)),
      kv_heads_(c.num_key_value_heads / tp_size_of(tp)),
      head_dim_(c.resolved_head_dim()) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * head_dim_, kv = c.num_key_value_heads * head_dim_;
  tp = examples::split_group(tp);
  // q_proj's rows are heads, k_proj's and v_proj's kv heads, each split
  // evenly: rank r's query heads [r H/tp, (r+1) H/tp) read the kv heads
  // [r KV/tp, (r+1) KV/tp), which are the ones it holds (repeat_kv).
  using zest::tp::ParallelLinearOptions;
  const bool bias = c.qkv_bias();
  examples::make_projection(*this, "q_proj", ParallelLinearOptions(h, q).bias(bias), tp, q_proj, q_proj_tp);
  examples::make_projection(*this, "k_proj", ParallelLinearOptions(h, kv).bias(bias), tp, k_proj, k_proj_tp);
  examples::make_projection(*this, "v_proj", ParallelLinearOptions(h, kv).bias(bias), tp, v_proj, v_proj_tp);
  examples::make_projection(*this, "o_proj", ParallelLinearOptions(q, h).bias(c.o_bias()), tp, o_proj, o_proj_tp);
  if (c.qk_norm()) {
    q_norm = register_module("q_norm", RMSNorm(head_dim_, c.rms_norm_eps, tp));
    k_norm = register_module("k_norm", RMSNorm(head_dim_, c.rms_norm_eps, tp));
  }
}

torch::Tensor LlamaAttentionImpl::forward(const torch::Tensor& x, const Rotary& rope) {
  const int64_t B = x.size(0), T = x.size(1);
  const auto heads = [&](const torch::Tensor& t) { return t.view({B, T, -1, head_dim_}).transpose(1, 2); };
  // qwen3: each head's query and key RMS-normalized before RoPE.
  const auto normed_heads = [&](const torch::Tensor& t, RMSNorm& norm) {
    return norm ? norm->forward(t.view({B, T, -1, head_dim_})).transpose(1, 2) : heads(t);
  };
  torch::Tensor q = normed_heads(q_proj ? q_proj->forward(x) : q_proj_tp->forward(x), q_norm);
  torch::Tensor k = normed_heads(k_proj ? k_proj->forward(x) : k_proj_tp->forward(x), k_norm);
  const torch::Tensor v = heads(v_proj ? v_proj->forward(x) : v_proj_tp->forward(x));
  // apply_rotary_pos_emb: cos and sin [T, d] broadcast over batch and heads.
  q = q * rope.cos + rotate_half(q) * rope.sin;
  k = k * rope.cos + rotate_half(k) * rope.sin;
  const int64_t n_rep = heads_ / kv_heads_;
  const torch::Tensor keys = repeat_kv(k, n_rep), values = repeat_kv(v, n_rep);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim_));
  if (rope.attention_tile > 0) {
    const zest::AttentionMask mask{.causal = true, .sliding_window = rope.sliding_window, .documents = rope.documents};
    const torch::Tensor out = zest::tiled_attention(q, keys, values, mask, scale, rope.attention_tile);
    const torch::Tensor o = out.transpose(1, 2).contiguous().reshape({B, T, -1});
    return o_proj ? o_proj->forward(o) : o_proj_tp->forward(o);
  }
  torch::Tensor scores = torch::matmul(q, keys.transpose(2, 3)) * scale;
  // HF adds the dtype's lowest value above the diagonal; exp of it underflows
  // to 0 as exp(-inf) does, so the probabilities are the same.
  const torch::Tensor blocked =
      rope.blocked.defined()
          ? rope.blocked
          : torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  scores = scores.masked_fill(blocked, -std::numeric_limits<float>::infinity());
  const torch::Tensor probs = torch::softmax(scores, -1, torch::kFloat).to(q.scalar_type());
  const torch::Tensor out = torch::matmul(probs, values).transpose(1, 2).contiguous().reshape({B, T, -1});
  return o_proj ? o_proj->forward(out) : o_proj_tp->forward(out);
}

LlamaMlpImpl::LlamaMlpImpl(const Config& c, zest::Communicator* tp) {
  tp = examples::split_group(tp);
  const int64_t h = c.hidden_size, i = c.intermediate_size;
  // gate and up split alike, so silu(gate) * up pairs this rank's columns.
  using zest::tp::ParallelLinearOptions;
  const bool bias = c.mlp_bias;
  examples::make_projection(*this, "gate_proj", ParallelLinearOptions(h, i).bias(bias), tp, gate_proj, gate_proj_tp);
  examples::make_projection(*this, "up_proj", ParallelLinearOptions(h, i).bias(bias), tp, up_proj, up_proj_tp);
  examples::make_projection(*this, "down_proj", ParallelLinearOptions(i, h).bias(bias), tp, down_proj, down_proj_tp);
}

torch::Tensor LlamaMlpImpl::forward(const torch::Tensor& x) {
  const torch::Tensor gate = gate_proj ? gate_proj->forward(x) : gate_proj_tp->forward(x);
  const torch::Tensor up = up_proj ? up_proj->forward(x) : up_proj_tp->forward(x);
  const torch::Tensor act = torch::silu(gate) * up;
  return down_proj ? down_proj->forward(act) : down_proj_tp->forward(act);
}

LlamaDecoderLayerImpl::LlamaDecoderLayerImpl(const Config& c, zest::Communicator* tp) {
  input_layernorm = register_module("input_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  self_attn = register_module("self_attn", LlamaAttention(c, tp));
  post_attention_layernorm = register_module("post_attention_layernorm", RMSNorm(c.hidden_size, c.rms_norm_eps));
  mlp = register_module("mlp", LlamaMlp(c, tp));
}

torch::Tensor LlamaDecoderLayerImpl::forward(const torch::Tensor& x, const Rotary& rope) {
  const torch::Tensor h = x + self_attn->forward(input_layernorm->forward(x), rope);
  const torch::Tensor normed = post_attention_layernorm->forward(h);
  if (rope.mlp_tile > 0) {
    return h + zest::tiled_forward(*mlp, normed, rope.mlp_tile, [this](const torch::Tensor& t) { return mlp->forward(t); });
  }
  return h + mlp->forward(normed);
}

LlamaDecoderLayer make_block(const Config& c, int64_t i, uint64_t seed, zest::Communicator* tp) {
  LlamaDecoderLayer whole(c);
  // Seed 0 of the stream is the embeddings' and the head's (the model's).
  init_parameters(*whole, c.initializer_range,
                  at::detail::createCPUGenerator(seed * kSeedStride + static_cast<uint64_t>(i) + 1));
  tp = examples::split_group(tp);
  if (tp == nullptr) return whole;
  LlamaDecoderLayer part(c, tp);
  torch::NoGradGuard no_grad;
  const auto values = whole->named_parameters();
  for (const auto& item : part->named_parameters()) {
    item.value().copy_(part_of_whole(item.key(), values[item.key()], tp->rank(), tp->size()));
  }
  return part;
}

LlamaModelImpl::LlamaModelImpl(const Config& c, const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                               bool placeholders, const Placement& placement) {
  zest::Communicator* tp = placement.split_group();
  if (placement.first()) {
    if (tp == nullptr) {
      embed_tokens = register_module("embed_tokens", torch::nn::Embedding(c.vocab_size, c.hidden_size));
      if (placeholders) zest::placeholder(embed_tokens);  // before the layers: one unit's memory at a time
    } else {
      embed_tokens_tp = register_module(
          "embed_tokens",
          zest::tp::VocabParallelEmbedding(*tp, zest::tp::VocabParallelEmbeddingOptions(c.vocab_size, c.hidden_size)));
      if (placeholders) zest::placeholder(embed_tokens_tp);
    }
  }
  layers = register_module("layers", torch::nn::ModuleDict());
  const auto [begin, end] = placement.blocks(c.num_hidden_layers);
  for (int64_t i = begin; i < end; ++i) {
    layers->update(std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{
        {std::to_string(i), make_layer(i).ptr()}});
  }
  if (placement.last()) norm = register_module("norm", RMSNorm(c.hidden_size, c.rms_norm_eps));
}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c, uint64_t seed, const Placement& placement)
    : LlamaForCausalLMImpl(
          c, seed, [&c, seed, tp = placement.tp](int64_t i) { return make_block(c, i, seed, tp); },
          /*placeholders=*/false, placement) {}

LlamaForCausalLMImpl::LlamaForCausalLMImpl(const Config& c, uint64_t seed,
                                           const std::function<LlamaDecoderLayer(int64_t)>& make_layer,
                                           bool placeholders, const Placement& placement)
    : config_(c), placement_(placement), rope_cached_len_(c.max_position_embeddings) {
  c.validate();
  validate(placement, c);
  placement_.tp = placement.split_group();
  zest::Communicator* tp = placement_.tp;
  model = register_module("model", LlamaModel(c, make_layer, placeholders, placement_));
  if (!c.tie_word_embeddings && placement_.last()) {
    if (tp == nullptr) {
      lm_head = register_module("lm_head",
                                torch::nn::Linear(torch::nn::LinearOptions(c.hidden_size, c.vocab_size).bias(false)));
      if (placeholders) zest::placeholder(lm_head);
    } else {
      lm_head_tp = register_module(
          "lm_head",
          zest::tp::ColumnParallelLinear(*tp, zest::tp::ParallelLinearOptions(c.hidden_size, c.vocab_size).bias(false)));
      if (placeholders) zest::placeholder(lm_head_tp);
    }
  }
  if (placeholders) return;  // the values come from a checkpoint
  initialize(seed);
}

void LlamaForCausalLMImpl::initialize(uint64_t seed) {
  // HF's _init_weights from the model's own generator: the embeddings, then
  // an untied head, each drawn whole whether or not this rank holds it, so
  // every part gets the whole model's values.
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed * kSeedStride);
  const auto draw = [&](const char* name, const torch::Tensor& mine) {
    const torch::Tensor whole =
        torch::empty({config_.vocab_size, config_.hidden_size}).normal_(0.0, config_.initializer_range, gen);
    if (mine.defined()) mine.copy_(part_of_whole(name, whole, placement_.tp_rank(), placement_.tp_size()));
  };
  draw("model.embed_tokens.weight", placement_.first() ? embedding_weight() : torch::Tensor());
  if (config_.tie_word_embeddings) return;
  draw("lm_head.weight", lm_head ? lm_head->weight : lm_head_tp ? lm_head_tp->weight : torch::Tensor());
}

torch::ScalarType LlamaForCausalLMImpl::activation_dtype() const { return parameters().front().scalar_type(); }

const torch::Tensor& LlamaForCausalLMImpl::embedding_weight() const {
  if (model->embed_tokens) return model->embed_tokens->weight;
  if (model->embed_tokens_tp) return model->embed_tokens_tp->weight;
  throw std::logic_error("the embeddings are on the first pipeline stage");
}

torch::Tensor LlamaForCausalLMImpl::embed(const torch::Tensor& tokens) {
  const torch::Tensor x =
      model->embed_tokens ? model->embed_tokens->forward(tokens) : model->embed_tokens_tp->forward(tokens);
  return tie_ ? tie_(x) : x;
}

torch::Tensor LlamaForCausalLMImpl::head(const torch::Tensor& x) {
  if (lm_head) return lm_head->forward(x);
  if (lm_head_tp) return lm_head_tp->forward(x);
  return examples::tied_head_logits(x, head_weight_.defined() ? head_weight_ : embedding_weight(), placement_.tp);
}

torch::Tensor LlamaForCausalLMImpl::forward(const torch::Tensor& tokens, const UnitRunner& run,
                                            const LayerRunner& run_layer) {
  if (placement_.stages != 1) {
    throw std::logic_error("Llama forward of the whole model on a pipeline stage: use forward_stage");
  }
  return forward_part(tokens, run, run_layer);
}

torch::Tensor LlamaForCausalLMImpl::forward_stage(const torch::Tensor& input, const UnitRunner& run) {
  return forward_part(input, run, layer_runner_);
}

torch::Tensor LlamaForCausalLMImpl::forward_part(const torch::Tensor& input, const UnitRunner& run,
                                                 const LayerRunner& run_layer) {
  const int64_t T = input.size(1);
  // yarn's context is factor x its original length; dynamic scaling grows
  // with the sequence; the others stop at max_position_embeddings.
  const RopeScaling& scaling = config_.rope_scaling;
  const int64_t longest =
      scaling.type == "dynamic" ? std::numeric_limits<int64_t>::max()
      : scaling.type == "yarn"
          ? std::max(config_.max_position_embeddings,
                     static_cast<int64_t>(scaling.factor * static_cast<double>(scaling.original_max_position_embeddings)))
          : config_.max_position_embeddings;
  if (T > longest) {
    throw std::invalid_argument(fmt::format("a sequence of {} tokens is longer than max_position_embeddings {}", T,
                                            config_.max_position_embeddings));
  }
  torch::Tensor x = placement_.first() ? run(embed_unit(), [&] { return embed(input); }) : input;
  // dynamic scaling's length: transformers' max(position_ids) + 1.
  const int64_t rope_len =
      scaling.type != "dynamic"
          ? 0
          : rope_dynamic_length(config_, positions_.defined() ? positions_.max().item<int64_t>() + 1 : T,
                                rope_cached_len_);
  Rotary rope;
  if (positions_.defined()) {
    if (positions_.size(0) != input.size(0) || positions_.size(1) != T) {
      throw std::invalid_argument(fmt::format("packed rows' positions are {}, the input [{}, {}]: set_packing of "
                                              "another batch",
                                              c10::str(positions_.sizes()), input.size(0), T));
    }
    rope = rotary(config_, positions_.to(x.device()), documents_.to(x.device()), x.scalar_type(), rope_len,
                  attention_tile_ == 0);
    if (attention_tile_ > 0) rope.documents = documents_.to(x.device());
  } else {
    rope = rotary(config_, T, x.scalar_type(), x.device(), rope_len, attention_tile_ == 0);
  }
  rope.attention_tile = attention_tile_;
  rope.mlp_tile = mlp_tile_;
  rope.sliding_window = config_.sliding_window;
  for (LlamaDecoderLayer layer : layers()) {
    x = run_layer ? run_layer(layer, x, rope) : run(*layer, [&] { return layer->forward(x, rope); });
  }
  if (!placement_.last()) return x;
  x = run(*model->norm, [&] { return model->norm->forward(x); });
  if (loss_chunk_ > 0) {
    head_runner_ = run;
    return x;  // the loss computes the head: set_loss_chunk
  }
  // The tied head's copy on the last of several stages is no parameter of
  // this stage's engine (PipelineStage::tie_last): there is no unit to run.
  if (head_weight_.defined()) return head(x);
  return run(head_unit(), [&] { return head(x); });
}

void LlamaForCausalLMImpl::set_packing(torch::Tensor positions, torch::Tensor documents) {
  if (positions.defined() != documents.defined() || (positions.defined() && positions.sizes() != documents.sizes())) {
    throw std::invalid_argument("set_packing: positions and document ids of one shape, [rows, tokens], or neither");
  }
  positions_ = std::move(positions);
  documents_ = std::move(documents);
}

void LlamaForCausalLMImpl::set_tiles(int64_t attention, int64_t mlp) {
  if (attention < 0 || mlp < 0) {
    throw std::invalid_argument(fmt::format("tiles of {} (attention) and {} (MLP) tokens", attention, mlp));
  }
  attention_tile_ = attention;
  mlp_tile_ = mlp;
}

void LlamaForCausalLMImpl::set_loss_chunk(int64_t tokens) {
  if (tokens < 0) throw std::invalid_argument(fmt::format("a loss chunk of {} tokens", tokens));
  if (tokens > 0 && placement_.tp_size() > 1) {
    throw std::invalid_argument("a chunked loss under tensor parallelism: the head is split by vocabulary there "
                                "(--loss-chunk needs --tp 1)");
  }
  loss_chunk_ = tokens;
}

torch::Tensor LlamaForCausalLMImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (loss_chunk_ > 0) return loss_sum(logits, targets) / (targets != -100).sum().to(torch::kFloat);
  return examples::vocab_loss_mean(logits.to(torch::kFloat), targets, placement_.tp);
}

torch::Tensor LlamaForCausalLMImpl::loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  if (loss_chunk_ > 0) {
    // `logits` is the final norm's output here.
    const auto chunked = [&] {
      const torch::Tensor& weight =
          lm_head ? lm_head->weight : head_weight_.defined() ? head_weight_ : embedding_weight();
      return zest::chunked_cross_entropy_sum(logits, weight, targets, loss_chunk_);
    };
    if (head_weight_.defined() || !head_runner_) return chunked();  // a pipeline's copy: no unit
    return head_runner_(head_unit(), chunked);
  }
  return examples::vocab_loss_sum(logits.to(torch::kFloat), targets, placement_.tp);
}

torch::Tensor LlamaForCausalLMImpl::whole_logits(const torch::Tensor& logits) {
  if (loss_chunk_ > 0) throw std::logic_error("whole_logits with a chunked loss: the forward returned no logits");
  return examples::whole_vocab_logits(logits, placement_.tp);
}

std::vector<std::shared_ptr<torch::nn::Module>> LlamaForCausalLMImpl::units() const {
  std::vector<std::shared_ptr<torch::nn::Module>> out;
  const bool untied = !config_.tie_word_embeddings;
  if (untied && model->embed_tokens) out.push_back(model->embed_tokens.ptr());
  if (untied && model->embed_tokens_tp) out.push_back(model->embed_tokens_tp.ptr());
  for (const auto& layer : model->layers->values()) out.push_back(layer);
  if (model->norm) out.push_back(model->norm.ptr());
  if (lm_head) out.push_back(lm_head.ptr());
  if (lm_head_tp) out.push_back(lm_head_tp.ptr());
  return out;
}

const torch::nn::Module& LlamaForCausalLMImpl::embed_unit() const {
  if (config_.tie_word_embeddings) return *this;
  if (model->embed_tokens) return *model->embed_tokens;
  if (model->embed_tokens_tp) return *model->embed_tokens_tp;
  throw std::logic_error("the embeddings are on the first pipeline stage");
}

const torch::nn::Module& LlamaForCausalLMImpl::head_unit() const {
  if (config_.tie_word_embeddings) return *this;
  if (lm_head) return *lm_head;
  if (lm_head_tp) return *lm_head_tp;
  throw std::logic_error("the head is on the last pipeline stage");
}

std::vector<LlamaDecoderLayer> LlamaForCausalLMImpl::layers() const {
  std::vector<LlamaDecoderLayer> out;
  for (const auto& m : model->layers->values()) {
    out.emplace_back(std::dynamic_pointer_cast<LlamaDecoderLayerImpl>(m));
  }
  return out;
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return examples::vocab_loss_mean(logits.to(torch::kFloat), targets, nullptr);
}

}  // namespace llama
