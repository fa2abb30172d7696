// A Llama-family model's sizes, as Hugging Face's LlamaConfig keeps them in
// a checkpoint's config.json (transformers/models/llama/configuration_llama.py):
// the same keys, the same defaults, the same derived values (head_dim =
// hidden_size / num_attention_heads when absent, num_key_value_heads =
// num_attention_heads when absent or null).
//
//   llama::Config c = llama::Config::from_json_file("Llama-3.2-1B/config.json");
//   std::string text = c.to_json();   // what --export-hf writes back
//
// rope_scaling: null, or {"rope_type": "default" | "linear" | "llama3" |
// "yarn" | "dynamic", ...} ("type" is read as rope_type, as transformers
// does), computed as transformers 5's modeling_rope_utils computes them;
// any other kind (longrope, ...) is refused by name. transformers 5's layout
// is read too: "rope_parameters" holding rope_type, rope_theta and the
// scaling's keys (top-level rope_theta the fallback, as its
// standardize_rope_params does).
//
// The family, from "model_type" (else "architectures"; neither: llama),
// each with its transformers class's keys, defaults and modules:
//   llama    LlamaForCausalLM (attention_bias on q, k, v and o; mlp_bias)
//   mistral  MistralForCausalLM: Llama's modules without biases, plus
//            "sliding_window", a query seeing the keys less than that many
//            tokens back
//   qwen2    Qwen2ForCausalLM (Qwen2/2.5): biases on q, k and v, none on o
//   qwen3    Qwen3ForCausalLM: per-head RMSNorms of the queries and keys
//            (self_attn.q_norm, k_norm: [head_dim]) before RoPE, head_dim
//            128 when absent, attention_bias on q, k, v and o
// Other families (mixtral, gemma, ...) are refused by name, as is any key
// that changes the function and is not honoured (attention_dropout > 0,
// partial_rotary_factor != 1, per-layer rope parameters, layer types other
// than full attention, Qwen's use_sliding_window, experts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zest {
class HfCheckpoint;
}

namespace llama {

struct RopeScaling {
  std::string type = "default";  // default (none), linear, llama3, yarn or dynamic
  double factor = 1.0;
  // llama3 only.
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  // llama3 and yarn (yarn: max_position_embeddings when absent).
  int64_t original_max_position_embeddings = 8192;
  // yarn only: 0 is absent (transformers' defaults: attention_factor from
  // factor and mscale, beta_fast 32, beta_slow 1).
  double attention_factor = 0.0;
  double beta_fast = 32.0;
  double beta_slow = 1.0;
  double mscale = 0.0;
  double mscale_all_dim = 0.0;
  bool truncate = true;
};

struct Config {
  int64_t vocab_size = 256;  // the example's from-scratch sizes (byte-level)
  int64_t hidden_size = 128;
  int64_t intermediate_size = 352;
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 4;
  int64_t num_key_value_heads = 2;
  int64_t head_dim = 0;  // 0: hidden_size / num_attention_heads
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position_embeddings = 2048;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool mlp_bias = false;
  std::string hidden_act = "silu";
  std::string torch_dtype = "float32";
  std::string model_type = "llama";  // llama, mistral, qwen2 or qwen3
  int64_t sliding_window = 0;        // mistral's; 0: none (every earlier token seen)
  double initializer_range = 0.02;

  // Parses config.json's text. Throws std::invalid_argument naming the key
  // and what it must be: a missing size, a wrong type, an unsupported
  // hidden_act or rope_scaling kind, sizes that do not divide.
  static Config from_json(const std::string& text, const std::string& where = "config.json");
  static Config from_json_file(const std::string& path);
  // LlamaConfig's keys and values ("architectures": ["LlamaForCausalLM"],
  // "model_type": "llama").
  std::string to_json() const;

  // The family's attention biases and norms.
  bool qkv_bias() const { return model_type == "qwen2" || attention_bias; }
  bool o_bias() const { return model_type != "qwen2" && attention_bias; }
  bool qk_norm() const { return model_type == "qwen3"; }
  int64_t resolved_head_dim() const { return head_dim > 0 ? head_dim : hidden_size / num_attention_heads; }
  // Throws std::invalid_argument naming the field (sizes >= 1, heads a
  // multiple of kv heads, hidden_size a multiple of heads when head_dim is
  // not given, vocab_size >= 256 for byte-level training).
  void validate() const;
  // Every parameter, a tied head counted once.
  int64_t parameters() const;
  // Before anything is built: the checkpoint's tensors (read from their
  // headers) have the shapes these sizes give: the embeddings
  // [vocab_size, hidden_size], as many layers as num_hidden_layers, layer
  // 0's q/k/v projections (heads x head_dim), its MLP (intermediate_size).
  // Throws std::invalid_argument naming config.json's key and the tensor.
  void check_shapes(const zest::HfCheckpoint& checkpoint, const std::string& dir) const;
  // "4 layers, hidden 128, 4 heads (2 kv, head_dim 32), intermediate 352, vocab 256, untied head"
  std::string str() const;
};

}  // namespace llama
