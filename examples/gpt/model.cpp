#include "model.h"

#include "common/projection.h"
#include "common/vocab_head.h"

#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "zest/core/check.h"
#include "zest/core/file_io.h"

namespace gpt {

void Config::validate() const {
  const auto positive = [](const char* name, int64_t v) {
    if (v < 1) throw std::invalid_argument(fmt::format("{} is {}; it must be at least 1", name, v));
  };
  positive("vocab", vocab);
  positive("context", context);
  positive("layers", layers);
  positive("heads", heads);
  positive("d_model", d_model);
  if (d_model % heads != 0) {
    throw std::invalid_argument(
        fmt::format("d_model {} does not divide into {} heads; pick d_model a multiple of heads", d_model, heads));
  }
}

int64_t Config::parameters() const {
  const int64_t d = d_model;
  // ln_1, c_attn, c_proj, ln_2, c_fc, c_proj
  const int64_t block = 2 * d + (3 * d * d + 3 * d) + (d * d + d) + 2 * d + (4 * d * d + 4 * d) + (4 * d * d + d);
  return vocab * d + context * d + layers * block + 2 * d + (tied_head ? 0 : vocab * d);
}

std::string Config::str() const {
  return fmt::format("{} layers, {} heads, d_model {}, context {}, vocab {}, {} head", layers, heads, d_model,
                     context, vocab, tied_head ? "tied" : "untied");
}

std::string Config::to_json(const std::string& torch_dtype) const {
  const nlohmann::json j = {{"architectures", {"ZestGpt"}}, {"model_type", "zest_gpt"}, {"vocab_size", vocab},
                            {"n_positions", context}, {"n_layer", layers}, {"n_head", heads}, {"n_embd", d_model},
                            {"tie_word_embeddings", tied_head}, {"torch_dtype", torch_dtype}};
  return j.dump(2) + "\n";
}

Config Config::from_json_file(const std::string& path, std::string* torch_dtype) {
  std::string text;
  try {
    // Not a FIFO or a device (which would block), at most a few MiB.
    text = zest::read_text_file(path, {.max_bytes = uint64_t{4} << 20, .follow_links = true});
  } catch (const zest::Error& e) {
    throw std::invalid_argument(e.message());
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw std::invalid_argument(fmt::format("{} is not a JSON object", path));
  Config c;
  const auto size = [&](const char* key, int64_t& out) {
    if (!j.contains(key) || !j.at(key).is_number_integer()) {
      throw std::invalid_argument(fmt::format("{}: '{}' is missing or not a whole number", path, key));
    }
    out = j.at(key).get<int64_t>();
  };
  size("vocab_size", c.vocab);
  size("n_positions", c.context);
  size("n_layer", c.layers);
  size("n_head", c.heads);
  size("n_embd", c.d_model);
  if (j.contains("tie_word_embeddings")) {
    if (!j.at("tie_word_embeddings").is_boolean()) {
      throw std::invalid_argument(fmt::format("{}: 'tie_word_embeddings' is not true or false", path));
    }
    c.tied_head = j.at("tie_word_embeddings").get<bool>();
  }
  if (torch_dtype != nullptr) {
    const auto d = j.find("torch_dtype");
    *torch_dtype = d != j.end() && d->is_string() ? d->get<std::string>() : std::string("bfloat16");
  }
  c.validate();
  return c;
}

void validate(const Placement& placement, const Config& c) {
  const int t = placement.tp_size();
  if (c.heads % t != 0 || c.vocab % t != 0) {
    throw std::invalid_argument(fmt::format(
        "tensor parallelism over {} ranks splits the {} heads and the vocabulary of {} evenly: pick a tp size "
        "dividing both",
        t, c.heads, c.vocab));
  }
  placement.validate_stages(c.layers);
}

torch::Tensor part_of_whole(const std::string& name, const torch::Tensor& whole, int tp_rank, int tp_size) {
  if (tp_size == 1) return whole;
  const auto part = [&](int64_t dim, int64_t stride) {
    return zest::tp::partition(whole, dim, tp_rank, tp_size, stride);
  };
  if (name == "wte.weight" || name == "lm_head.weight") return part(0, 1);
  // Column-parallel: rows of the weight, the bias and the LoRA adapter B
  // (c_attn's with stride 3); the adapter A whole (tensor_parallel.h).
  const bool adapter_a = name.ends_with("lora_A.weight"), adapter_b = name.ends_with("lora_B.weight");
  if (name.find(".c_fc.") != std::string::npos) return adapter_a ? whole : part(0, 1);
  if (name.find(".c_attn.") != std::string::npos) return adapter_a ? whole : part(0, 3);
  // Row-parallel: columns of the weight and the adapter A; the bias and the
  // adapter B whole.
  if (name.find(".c_proj.") != std::string::npos) {
    return name.ends_with(".bias") || adapter_b ? whole : part(1, 1);
  }
  return whole;  // LayerNorms, wpe
}

std::vector<std::string> lora_targets() { return {"c_attn", "c_proj", "c_fc"}; }

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const Config& c, zest::Communicator* tp)
    : heads_(c.heads / (tp != nullptr ? tp->size() : 1)) {
  using zest::tp::ParallelLinearOptions;
  examples::make_projection(*this, "c_attn", ParallelLinearOptions(c.d_model, 3 * c.d_model).stride(3), tp, c_attn,
                            c_attn_tp);
  examples::make_projection(*this, "c_proj", ParallelLinearOptions(c.d_model, c.d_model), tp, c_proj, c_proj_tp);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const torch::Tensor qkv_all = c_attn ? c_attn->forward(x) : c_attn_tp->forward(x);
  // C: this rank's width, d_model / tp.
  const int64_t B = x.size(0), T = x.size(1), C = qkv_all.size(2) / 3, hd = C / heads_;
  const std::vector<torch::Tensor> qkv = qkv_all.split(C, /*dim=*/2);
  // [B, T, C] -> [B, heads, T, hd]
  const auto split_heads = [&](const torch::Tensor& t) { return t.view({B, T, heads_, hd}).transpose(1, 2); };
  const torch::Tensor q = split_heads(qkv[0]), k = split_heads(qkv[1]), v = split_heads(qkv[2]);
  torch::Tensor att = q.matmul(k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  // Made here rather than kept as a buffer: a module with buffers would
  // need TorchModuleOptions::allow_buffers, and T x T booleans cost little
  // next to the T x T scores.
  const torch::Tensor future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<float>::infinity());
  att = torch::softmax(att, /*dim=*/-1);
  const torch::Tensor y = att.matmul(v).transpose(1, 2).contiguous().view({B, T, C});
  return c_proj ? c_proj->forward(y) : c_proj_tp->forward(y);
}

MlpImpl::MlpImpl(const Config& c, zest::Communicator* tp) {
  using zest::tp::ParallelLinearOptions;
  examples::make_projection(*this, "c_fc", ParallelLinearOptions(c.d_model, 4 * c.d_model), tp, c_fc, c_fc_tp);
  examples::make_projection(*this, "c_proj", ParallelLinearOptions(4 * c.d_model, c.d_model), tp, c_proj, c_proj_tp);
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  const torch::Tensor up = torch::gelu(c_fc ? c_fc->forward(x) : c_fc_tp->forward(x), "tanh");  // GPT-2's GELU
  return c_proj ? c_proj->forward(up) : c_proj_tp->forward(up);
}

BlockImpl::BlockImpl(const Config& c, zest::Communicator* tp) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn = register_module("attn", CausalSelfAttention(c, tp));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  mlp = register_module("mlp", Mlp(c, tp));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn->forward(ln_1->forward(x));
  return x + mlp->forward(ln_2->forward(x));
}

namespace {

// Every parameter of the whole model in registration order, with its shape:
// the order the initialization draws in.
std::vector<std::pair<std::string, std::vector<int64_t>>> whole_parameters(const Config& c) {
  const int64_t d = c.d_model;
  std::vector<std::pair<std::string, std::vector<int64_t>>> out = {{"wte.weight", {c.vocab, d}},
                                                                   {"wpe.weight", {c.context, d}}};
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string b = fmt::format("h.{}.", l);
    for (const auto& [name, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {d}}, {"ln_1.bias", {d}}, {"attn.c_attn.weight", {3 * d, d}}, {"attn.c_attn.bias", {3 * d}},
             {"attn.c_proj.weight", {d, d}}, {"attn.c_proj.bias", {d}}, {"ln_2.weight", {d}}, {"ln_2.bias", {d}},
             {"mlp.c_fc.weight", {4 * d, d}}, {"mlp.c_fc.bias", {4 * d}}, {"mlp.c_proj.weight", {d, 4 * d}},
             {"mlp.c_proj.bias", {d}}}) {
      out.emplace_back(b + name, shape);
    }
  }
  out.emplace_back("ln_f.weight", std::vector<int64_t>{d});
  out.emplace_back("ln_f.bias", std::vector<int64_t>{d});
  if (!c.tied_head) out.emplace_back("lm_head.weight", std::vector<int64_t>{c.vocab, d});
  return out;
}

}  // namespace

GptImpl::GptImpl(const Config& c, uint64_t seed, Placement placement) : config_(c), placement_(placement) {
  c.validate();
  validate(placement, c);
  zest::Communicator* tp = placement.split_group();
  placement_.tp = tp;
  if (placement.first()) {
    if (tp == nullptr) {
      wte = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
    } else {
      wte_tp = register_module("wte", zest::tp::VocabParallelEmbedding(
                                          *tp, zest::tp::VocabParallelEmbeddingOptions(c.vocab, c.d_model)));
    }
    wpe = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
  }
  std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> blocks;
  const auto [begin, end] = placement.blocks(c.layers);
  for (int64_t l = begin; l < end; ++l) blocks.emplace_back(std::to_string(l), Block(c, tp).ptr());
  h = register_module("h", torch::nn::ModuleDict(blocks));
  if (placement.last()) {
    ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
    if (!c.tied_head && tp == nullptr) {
      lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
    } else if (!c.tied_head) {
      lm_head_tp = register_module(
          "lm_head", zest::tp::ColumnParallelLinear(*tp, zest::tp::ParallelLinearOptions(c.d_model, c.vocab).bias(false)));
    }
  }
  initialize(seed);
}

void GptImpl::initialize(uint64_t seed) {
  // Every parameter of the whole model in registration order from one
  // generator, and this rank keeps its part: the values depend on the seed
  // and the shape only, whatever the placement.
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(config_.layers));
  std::map<std::string, torch::Tensor> mine;
  for (const auto& item : named_parameters()) mine.emplace(item.key(), item.value());
  size_t kept = 0;
  for (const auto& [name, shape] : whole_parameters(config_)) {
    torch::Tensor whole = torch::empty(shape);
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (name.ends_with(".bias")) {
      whole.zero_();
    } else if (is_norm) {
      whole.fill_(1.0);
    } else if (name.ends_with("c_proj.weight")) {
      whole.normal_(0.0, residual_std, gen);
    } else {
      whole.normal_(0.0, 0.02, gen);
    }
    const auto it = mine.find(name);
    if (it == mine.end()) continue;
    it->second.copy_(part_of_whole(name, whole, placement_.tp_rank(), placement_.tp_size()));
    ++kept;
  }
  if (kept != mine.size()) {
    throw std::logic_error(fmt::format("GPT initialization: {} of the {} parameters are in the whole model's list",
                                       kept, mine.size()));
  }
}

torch::ScalarType GptImpl::activation_dtype() const { return parameters().front().scalar_type(); }

const torch::Tensor& GptImpl::embedding_weight() const {
  if (wte) return wte->weight;
  if (wte_tp) return wte_tp->weight;
  throw std::logic_error("wte is on the first pipeline stage");
}

torch::Tensor GptImpl::embed(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > config_.context) {
    throw std::invalid_argument(fmt::format("a sequence of {} tokens is longer than the context {}", T,
                                            config_.context));
  }
  const torch::Tensor pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  const torch::Tensor x = (wte ? wte->forward(tokens) : wte_tp->forward(tokens)) + wpe->forward(pos);
  return tie_ ? tie_(x) : x;
}

torch::Tensor GptImpl::head(const torch::Tensor& x) {
  const torch::Tensor y = ln_f->forward(x);
  if (lm_head) return lm_head->forward(y);
  if (lm_head_tp) return lm_head_tp->forward(y);
  return examples::tied_head_logits(y, head_weight_.defined() ? head_weight_ : embedding_weight(), placement_.tp);
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens, const UnitRunner& run) {
  if (placement_.stages != 1) {
    throw std::logic_error("GPT forward of the whole model on a pipeline stage: use forward_stage");
  }
  return forward_stage(tokens, run);
}

torch::Tensor GptImpl::forward_stage(const torch::Tensor& input, const UnitRunner& run) {
  torch::Tensor x = placement_.first() ? run(*this, [&] { return embed(input); }) : input;
  for (const auto& block : h->values()) {
    BlockImpl* b = block->as<Block>();
    x = run(*b, [&] { return b->forward(x); });
  }
  return placement_.last() ? run(*this, [&] { return head(x); }) : x;
}

torch::Tensor GptImpl::loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return examples::vocab_loss_mean(logits, targets, placement_.tp);
}

torch::Tensor GptImpl::loss_sum(const torch::Tensor& logits, const torch::Tensor& targets) {
  return examples::vocab_loss_sum(logits, targets, placement_.tp);
}

torch::Tensor GptImpl::whole_logits(const torch::Tensor& logits) {
  return examples::whole_vocab_logits(logits, placement_.tp);
}

std::vector<std::shared_ptr<torch::nn::Module>> GptImpl::blocks() const { return h->values(); }

torch::Tensor run_directly(const torch::nn::Module&, const std::function<torch::Tensor()>& piece) {
  return piece();
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return examples::vocab_loss_mean(logits, targets, nullptr);
}

}  // namespace gpt
