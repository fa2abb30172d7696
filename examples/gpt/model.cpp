#include "model.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
  std::ifstream in(path);
  if (!in) throw std::invalid_argument(fmt::format("cannot open {}", path));
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
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

std::vector<std::string> lora_targets() { return {"c_attn", "c_proj", "c_fc"}; }

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const Config& c) : heads_(c.heads) {
  c_attn = register_module("c_attn", zest::LoraLinear(c.d_model, 3 * c.d_model));
  c_proj = register_module("c_proj", zest::LoraLinear(c.d_model, c.d_model));
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2), hd = C / heads_;
  const std::vector<torch::Tensor> qkv = c_attn->forward(x).split(C, /*dim=*/2);
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
  return c_proj->forward(y);
}

MlpImpl::MlpImpl(const Config& c) {
  c_fc = register_module("c_fc", zest::LoraLinear(c.d_model, 4 * c.d_model));
  c_proj = register_module("c_proj", zest::LoraLinear(4 * c.d_model, c.d_model));
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) {
  return c_proj->forward(torch::gelu(c_fc->forward(x), "tanh"));  // GPT-2's GELU
}

BlockImpl::BlockImpl(const Config& c) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  attn = register_module("attn", CausalSelfAttention(c));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  mlp = register_module("mlp", Mlp(c));
}

torch::Tensor BlockImpl::forward(torch::Tensor x) {
  x = x + attn->forward(ln_1->forward(x));
  return x + mlp->forward(ln_2->forward(x));
}

GptImpl::GptImpl(const Config& c, uint64_t seed) : config_(c) {
  c.validate();
  wte = register_module("wte", torch::nn::Embedding(c.vocab, c.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(c.context, c.d_model));
  h = register_module("h", torch::nn::ModuleList());
  for (int64_t l = 0; l < c.layers; ++l) h->push_back(Block(c));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c.d_model})));
  if (!c.tied_head) {
    lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(c.d_model, c.vocab).bias(false)));
  }

  // Every parameter in registration order from one generator: the values
  // depend on the seed and the shape only.
  torch::NoGradGuard no_grad;
  at::Generator gen = at::detail::createCPUGenerator(seed);
  const double residual_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));
  for (const auto& item : named_parameters()) {
    const std::string& name = item.key();
    torch::Tensor p = item.value();
    const bool is_norm = name.find("ln_") != std::string::npos;
    if (name.ends_with(".bias")) {
      p.zero_();
    } else if (is_norm) {
      p.fill_(1.0);
    } else if (name.ends_with("c_proj.weight")) {
      p.normal_(0.0, residual_std, gen);
    } else {
      p.normal_(0.0, 0.02, gen);
    }
  }
}

torch::Tensor GptImpl::embed(const torch::Tensor& tokens) {
  const int64_t T = tokens.size(1);
  if (T > config_.context) {
    throw std::invalid_argument(fmt::format("a sequence of {} tokens is longer than the context {}", T,
                                            config_.context));
  }
  const torch::Tensor pos = torch::arange(T, torch::TensorOptions().dtype(torch::kLong).device(tokens.device()));
  return wte->forward(tokens) + wpe->forward(pos);
}

torch::Tensor GptImpl::head(const torch::Tensor& x) {
  const torch::Tensor y = ln_f->forward(x);
  return config_.tied_head ? torch::matmul(y, wte->weight.t()) : lm_head->forward(y);
}

torch::Tensor GptImpl::forward(const torch::Tensor& tokens, const UnitRunner& run) {
  torch::Tensor x = run(*this, [&] { return embed(tokens); });
  for (const auto& block : *h) {
    BlockImpl* b = block->as<Block>();
    x = run(*b, [&] { return b->forward(x); });
  }
  return run(*this, [&] { return head(x); });
}

std::vector<std::shared_ptr<torch::nn::Module>> GptImpl::blocks() const {
  return std::vector<std::shared_ptr<torch::nn::Module>>(h->begin(), h->end());
}

torch::Tensor run_directly(const torch::nn::Module&, const std::function<torch::Tensor()>& piece) {
  return piece();
}

torch::Tensor lm_loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace gpt
