#include "config.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/hf/hf_checkpoint.h"

namespace llama {
namespace {

constexpr uint64_t kMaxConfigBytes = uint64_t{4} << 20;

using nlohmann::json;

[[noreturn]] void fail(const std::string& where, const std::string& what) {
  throw std::invalid_argument(fmt::format("{}: {}", where, what));
}

// j[key] as an integer, a number, a bool or a string when present (and not
// null), else `fallback`; a value of another type is refused by name.
int64_t integer(const json& j, const char* key, int64_t fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number_integer()) fail(where, fmt::format("\"{}\" must be a whole number, not {}", key, j[key].dump()));
  if (j[key].is_number_unsigned() && j[key].get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) {
    fail(where, fmt::format("\"{}\" is {}, out of range", key, j[key].dump()));
  }
  return j[key].get<int64_t>();
}

double number(const json& j, const char* key, double fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_number()) fail(where, fmt::format("\"{}\" must be a number, not {}", key, j[key].dump()));
  return j[key].get<double>();
}

bool boolean(const json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_boolean()) fail(where, fmt::format("\"{}\" must be true or false, not {}", key, j[key].dump()));
  return j[key].get<bool>();
}

std::string text(const json& j, const char* key, const std::string& fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  if (!j[key].is_string()) fail(where, fmt::format("\"{}\" must be a string, not {}", key, j[key].dump()));
  return j[key].get<std::string>();
}

// The families this model computes, and each one's transformers class.
constexpr std::pair<const char*, const char*> kFamilies[] = {{"llama", "LlamaForCausalLM"},
                                                             {"mistral", "MistralForCausalLM"},
                                                             {"qwen2", "Qwen2ForCausalLM"},
                                                             {"qwen3", "Qwen3ForCausalLM"}};

std::string architecture_of(const std::string& family) {
  for (const auto& [name, architecture] : kFamilies) {
    if (family == name) return architecture;
  }
  return "LlamaForCausalLM";
}

// The scaling from `s` (rope_scaling, or transformers 5's rope_parameters,
// named `key`).
RopeScaling read_rope_scaling(const json& j, const char* key, const std::string& where) {
  // transformers 5 moved original_max_position_embeddings into the rope
  // parameters; a config that still has it at the top is read as it reads it
  // (both, with different values: refused).
  const auto top_level = [&](const json& s, const char* name) {
    if (s.contains(name) && j.contains(name) && s[name] != j[name]) {
      fail(where, fmt::format("\"{}\" is {} at the top level and {} in \"{}\": give one", name, j[name].dump(),
                              s[name].dump(), key));
    }
    return s.contains(name) ? s[name] : j.contains(name) ? j[name] : json();
  };
  RopeScaling r;
  if (!j.contains(key) || j[key].is_null()) return r;
  const json& s = j[key];
  if (!s.is_object()) fail(where, fmt::format("\"{}\" must be null or an object", key));
  const std::string at = where + ": " + key;
  for (const char* layer_type : {"full_attention", "sliding_attention", "chunked_attention"}) {
    if (s.contains(layer_type)) {
      fail(at, fmt::format("rope parameters per layer type (\"{}\") are not supported: one set for every layer",
                           layer_type));
    }
  }
  if (number(s, "partial_rotary_factor", 1.0, at) != 1.0) {
    fail(at, "partial_rotary_factor other than 1 is not supported: rotary embeddings over the whole head_dim");
  }
  // transformers reads the legacy "type" when "rope_type" is absent.
  r.type = text(s, "rope_type", text(s, "type", "default", at), at);
  if (r.type != "default" && r.type != "linear" && r.type != "llama3" && r.type != "yarn" && r.type != "dynamic") {
    fail(at, fmt::format("rope_type \"{}\" is not supported (supported: default, linear, llama3, yarn, dynamic)",
                         r.type));
  }
  if (r.type != "default" && r.type != "llama3" && (!s.contains("factor") || s["factor"].is_null())) {
    fail(at, fmt::format("{} scaling needs \"factor\"", r.type));
  }
  r.factor = number(s, "factor", 1.0, at);
  if (r.type != "default" && !(r.factor >= 1.0)) fail(at, fmt::format("factor {} must be at least 1", r.factor));
  if (r.type == "llama3") {
    for (const char* needed : {"factor", "low_freq_factor", "high_freq_factor"}) {
      if (!s.contains(needed)) fail(at, fmt::format("llama3 scaling needs \"{}\"", needed));
    }
    const json original = top_level(s, "original_max_position_embeddings");
    if (original.is_null()) fail(at, "llama3 scaling needs \"original_max_position_embeddings\"");
    r.low_freq_factor = number(s, "low_freq_factor", 1.0, at);
    r.high_freq_factor = number(s, "high_freq_factor", 4.0, at);
    r.original_max_position_embeddings =
        integer(json{{"original_max_position_embeddings", original}}, "original_max_position_embeddings", 8192, at);
    if (!(r.high_freq_factor > r.low_freq_factor)) {
      fail(at, "high_freq_factor must be larger than low_freq_factor");
    }
  }
  if (r.type == "yarn") {
    // transformers 5's _compute_yarn_parameters; 0: max_position_embeddings
    // (its standardize_rope_params), resolved by from_json.
    const json original = top_level(s, "original_max_position_embeddings");
    r.original_max_position_embeddings =
        original.is_null()
            ? 0
            : integer(json{{"original_max_position_embeddings", original}}, "original_max_position_embeddings", 0, at);
    r.attention_factor = number(s, "attention_factor", 0.0, at);
    if (s.contains("attention_factor") && !s["attention_factor"].is_null() && !(r.attention_factor > 0.0)) {
      fail(at, fmt::format("attention_factor {} must be positive", r.attention_factor));
    }
    // `rope_parameters.get("beta_fast") or 32`: absent, null or 0 is the default.
    r.beta_fast = number(s, "beta_fast", 0.0, at);
    r.beta_slow = number(s, "beta_slow", 0.0, at);
    if (r.beta_fast == 0.0) r.beta_fast = 32.0;
    if (r.beta_slow == 0.0) r.beta_slow = 1.0;
    r.mscale = number(s, "mscale", 0.0, at);
    r.mscale_all_dim = number(s, "mscale_all_dim", 0.0, at);
    r.truncate = boolean(s, "truncate", true, at);
  }
  return r;
}

// The family, from "model_type", else the first of "architectures", else
// llama; one this model does not compute is refused by name.
std::string family_of(const json& j, const std::string& where) {
  std::string family = text(j, "model_type", "", where);
  if (family.empty() && j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    family = j["architectures"][0].get<std::string>();
    for (const auto& [name, architecture] : kFamilies) {
      if (family == architecture) family = name;
    }
  }
  if (family.empty()) family = "llama";
  if (std::ranges::none_of(kFamilies, [&](const auto& f) { return family == f.first; })) {
    fail(where, fmt::format("model_type \"{}\" is not supported (supported: llama, mistral, qwen2, qwen3): its "
                            "modules or parameter names differ from theirs",
                            family));
  }
  return family;
}

}  // namespace

Config Config::from_json(const std::string& content, const std::string& where) {
  json j;
  try {
    j = json::parse(content);
  } catch (const json::exception& e) {
    fail(where, fmt::format("not valid JSON ({})", e.what()));
  }
  if (!j.is_object()) fail(where, "expected a JSON object of LlamaConfig's keys");
  Config c;
  c.model_type = family_of(j, where);
  // LlamaConfig's defaults where a key is absent; the sizes are required.
  for (const char* key : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"}) {
    if (!j.contains(key) || j[key].is_null()) {
      fail(where, fmt::format("\"{}\" is {}: a Llama config.json names every size", key,
                              j.contains(key) ? "null" : "missing"));
    }
  }
  c.vocab_size = integer(j, "vocab_size", 32000, where);
  c.hidden_size = integer(j, "hidden_size", 4096, where);
  c.intermediate_size = integer(j, "intermediate_size", 11008, where);
  c.num_hidden_layers = integer(j, "num_hidden_layers", 32, where);
  c.num_attention_heads = integer(j, "num_attention_heads", 32, where);
  c.num_key_value_heads = integer(j, "num_key_value_heads", c.num_attention_heads, where);
  // Qwen3Config's head_dim is 128 when absent; the others' hidden / heads.
  c.head_dim = integer(j, "head_dim", c.model_type == "qwen3" ? 128 : 0, where);
  c.rms_norm_eps = number(j, "rms_norm_eps", 1e-6, where);
  c.rope_theta = number(j, "rope_theta", 10000.0, where);
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    // transformers 5: the theta and the scaling in one object.
    c.rope_scaling = read_rope_scaling(j, "rope_parameters", where);
    if (j["rope_parameters"].is_object()) c.rope_theta = number(j["rope_parameters"], "rope_theta", c.rope_theta, where);
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      const RopeScaling legacy = read_rope_scaling(j, "rope_scaling", where);
      if (legacy.type != c.rope_scaling.type || legacy.factor != c.rope_scaling.factor) {
        fail(where, "\"rope_scaling\" and \"rope_parameters\" disagree: give one of them");
      }
    }
  } else {
    c.rope_scaling = read_rope_scaling(j, "rope_scaling", where);
  }
  if (c.model_type == "mistral") c.sliding_window = integer(j, "sliding_window", 0, where);
  if (c.sliding_window < 0) fail(where, fmt::format("sliding_window {} must be positive or null", c.sliding_window));
  if (c.model_type == "llama" && j.contains("sliding_window") && !j["sliding_window"].is_null()) {
    fail(where, "\"sliding_window\" in a llama config: LlamaForCausalLM has no sliding window (model_type mistral "
                "has)");
  }
  // Qwen2Config and Qwen3Config keep "sliding_window" (4096 by default) but
  // use it only with use_sliding_window, from layer max_window_layers on
  // (refused below); their released configs have it false.
  if (number(j, "attention_dropout", 0.0, where) != 0.0) {
    fail(where, "attention_dropout other than 0 is not supported: the attention probabilities are used whole");
  }
  if (number(j, "partial_rotary_factor", 1.0, where) != 1.0) {
    fail(where, "partial_rotary_factor other than 1 is not supported: rotary embeddings over the whole head_dim");
  }
  // transformers 5 writes the layer types it derived; all full attention is
  // what every family here computes.
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const json& types = j["layer_types"];
    const bool full = types.is_array() && std::all_of(types.begin(), types.end(), [](const json& t) {
      return t.is_string() && t.get<std::string>() == "full_attention";
    });
    if (!full) {
      fail(where, fmt::format("\"layer_types\" {} changes the model and is not supported: every layer here is "
                              "\"full_attention\"",
                              types.dump()));
    }
  }
  for (const char* key : {"num_local_experts", "num_experts", "use_sliding_window"}) {
    if (j.contains(key) && !j[key].is_null() && !(j[key].is_boolean() && !j[key].get<bool>())) {
      fail(where, fmt::format("\"{}\" changes the model and is not supported by this family's model", key));
    }
  }
  c.max_position_embeddings = integer(j, "max_position_embeddings", 2048, where);
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.original_max_position_embeddings == 0) {
    c.rope_scaling.original_max_position_embeddings = c.max_position_embeddings;
  }
  if (c.rope_scaling.type == "yarn" && c.rope_scaling.original_max_position_embeddings < 1) {
    fail(where, "original_max_position_embeddings must be at least 1");
  }
  c.tie_word_embeddings = boolean(j, "tie_word_embeddings", false, where);
  // LlamaConfig's attention_bias (q, k, v and o) and mlp_bias; Qwen3Config's
  // attention_bias. MistralConfig and Qwen2Config have neither: their
  // modules' biases are fixed (none, or Qwen2's on q, k and v).
  if (c.model_type == "llama" || c.model_type == "qwen3") c.attention_bias = boolean(j, "attention_bias", false, where);
  if (c.model_type == "llama") c.mlp_bias = boolean(j, "mlp_bias", false, where);
  c.hidden_act = text(j, "hidden_act", "silu", where);
  // Newer transformers write "dtype" where older ones wrote "torch_dtype".
  c.torch_dtype = text(j, "torch_dtype", text(j, "dtype", "float32", where), where);
  c.initializer_range = number(j, "initializer_range", 0.02, where);
  if (c.hidden_act != "silu") {
    fail(where, fmt::format("hidden_act \"{}\" is not supported: Llama's MLP is SwiGLU (\"silu\")", c.hidden_act));
  }
  try {
    c.validate();
  } catch (const std::invalid_argument& e) {
    fail(where, e.what());
  }
  return c;
}

Config Config::from_json_file(const std::string& path) {
  std::string text;
  try {
    // Not a FIFO or a device (which would block), at most a few MiB.
    text = zest::read_text_file(path, {.max_bytes = kMaxConfigBytes, .follow_links = true});
  } catch (const zest::Error& e) {
    throw std::invalid_argument(fmt::format("{}; give the checkpoint's config.json", e.message()));
  }
  return from_json(text, path);
}

std::string Config::to_json() const {
  nlohmann::ordered_json j;
  j["architectures"] = {architecture_of(model_type)};
  if (model_type == "llama" || model_type == "qwen3") j["attention_bias"] = attention_bias;
  j["head_dim"] = resolved_head_dim();
  j["hidden_act"] = hidden_act;
  j["hidden_size"] = hidden_size;
  j["initializer_range"] = initializer_range;
  j["intermediate_size"] = intermediate_size;
  j["max_position_embeddings"] = max_position_embeddings;
  if (model_type == "llama") j["mlp_bias"] = mlp_bias;
  j["model_type"] = model_type;
  j["num_attention_heads"] = num_attention_heads;
  j["num_hidden_layers"] = num_hidden_layers;
  j["num_key_value_heads"] = num_key_value_heads;
  j["rms_norm_eps"] = rms_norm_eps;
  if (rope_scaling.type == "default") {
    j["rope_scaling"] = nullptr;
  } else {
    nlohmann::ordered_json s;
    s["rope_type"] = rope_scaling.type;
    s["factor"] = rope_scaling.factor;
    if (rope_scaling.type == "llama3") {
      s["low_freq_factor"] = rope_scaling.low_freq_factor;
      s["high_freq_factor"] = rope_scaling.high_freq_factor;
      s["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
    }
    if (rope_scaling.type == "yarn") {
      s["original_max_position_embeddings"] = rope_scaling.original_max_position_embeddings;
      if (rope_scaling.attention_factor > 0.0) s["attention_factor"] = rope_scaling.attention_factor;
      s["beta_fast"] = rope_scaling.beta_fast;
      s["beta_slow"] = rope_scaling.beta_slow;
      if (rope_scaling.mscale != 0.0) s["mscale"] = rope_scaling.mscale;
      if (rope_scaling.mscale_all_dim != 0.0) s["mscale_all_dim"] = rope_scaling.mscale_all_dim;
      if (!rope_scaling.truncate) s["truncate"] = false;
    }
    j["rope_scaling"] = s;
  }
  j["rope_theta"] = rope_theta;
  if (model_type == "mistral") {
    if (sliding_window > 0) {
      j["sliding_window"] = sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
  }
  if (model_type == "qwen2" || model_type == "qwen3") {
    j["max_window_layers"] = num_hidden_layers;
    j["sliding_window"] = nullptr;
    j["use_sliding_window"] = false;
  }
  j["tie_word_embeddings"] = tie_word_embeddings;
  j["torch_dtype"] = torch_dtype;
  j["vocab_size"] = vocab_size;
  return j.dump(2) + "\n";
}

void Config::validate() const {
  const auto positive = [](const char* name, int64_t v) {
    if (v < 1) throw std::invalid_argument(fmt::format("{} is {}; it must be at least 1", name, v));
  };
  positive("hidden_size", hidden_size);
  positive("intermediate_size", intermediate_size);
  positive("num_hidden_layers", num_hidden_layers);
  positive("num_attention_heads", num_attention_heads);
  positive("num_key_value_heads", num_key_value_heads);
  positive("max_position_embeddings", max_position_embeddings);
  // Far above every released model's, and low enough that a wrong value is
  // refused before a layer is built, not after hours of building (or a
  // failed allocation deep in libtorch).
  const auto bounded = [](const char* name, int64_t v, int64_t most) {
    if (v > most) {
      throw std::invalid_argument(
          fmt::format("{} is {}; at most {} is accepted (no released model comes near)", name, v, most));
    }
  };
  bounded("vocab_size", vocab_size, int64_t{1} << 22);
  bounded("hidden_size", hidden_size, int64_t{1} << 17);
  bounded("intermediate_size", intermediate_size, int64_t{1} << 20);
  bounded("num_hidden_layers", num_hidden_layers, 4096);
  bounded("num_attention_heads", num_attention_heads, 4096);
  bounded("num_key_value_heads", num_key_value_heads, 4096);
  bounded("head_dim", head_dim, 4096);
  bounded("max_position_embeddings", max_position_embeddings, int64_t{1} << 30);
  if (head_dim < 0) throw std::invalid_argument(fmt::format("head_dim is {}; it must be at least 1", head_dim));
  if (vocab_size < 256) {
    throw std::invalid_argument(
        fmt::format("vocab_size is {}; the example trains on bytes, so it must be at least 256", vocab_size));
  }
  if (num_attention_heads % num_key_value_heads != 0) {
    throw std::invalid_argument(fmt::format("num_attention_heads {} is not a multiple of num_key_value_heads {}",
                                            num_attention_heads, num_key_value_heads));
  }
  if (head_dim == 0 && hidden_size % num_attention_heads != 0) {
    throw std::invalid_argument(fmt::format(
        "hidden_size {} does not divide into {} heads; give head_dim or a multiple of num_attention_heads",
        hidden_size, num_attention_heads));
  }
  if (resolved_head_dim() % 2 != 0) {
    throw std::invalid_argument(fmt::format("head_dim {} is odd; rotary embeddings need an even head_dim",
                                            resolved_head_dim()));
  }
  if (!(rms_norm_eps > 0.0) || !(rope_theta > 0.0)) {
    throw std::invalid_argument("rms_norm_eps and rope_theta must be positive");
  }
}

int64_t Config::parameters() const {
  const int64_t h = hidden_size, d = resolved_head_dim(), q = num_attention_heads * d,
                kv = num_key_value_heads * d, m = intermediate_size;
  const int64_t attn = h * q + 2 * h * kv + q * h + (qkv_bias() ? q + 2 * kv : 0) + (o_bias() ? h : 0) +
                       (qk_norm() ? 2 * d : 0);
  const int64_t mlp = 3 * h * m + (mlp_bias ? 2 * m + h : 0);
  const int64_t layer = attn + mlp + 2 * h;
  return vocab_size * h * (tie_word_embeddings ? 1 : 2) + num_hidden_layers * layer + h;
}

std::string Config::str() const {
  return fmt::format("{} layers, hidden {}, {} heads ({} kv, head_dim {}), intermediate {}, vocab {}, {} head",
                     num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, resolved_head_dim(),
                     intermediate_size, vocab_size, tie_word_embeddings ? "tied" : "untied");
}

void Config::check_shapes(const zest::HfCheckpoint& checkpoint, const std::string& dir) const {
  const auto shape_of = [&](const std::string& name) -> std::optional<std::vector<int64_t>> {
    if (!checkpoint.contains(name)) return std::nullopt;
    return checkpoint.tensor(name).shape;
  };
  const auto show = [](const std::vector<int64_t>& s) { return fmt::format("[{}]", fmt::join(s, ", ")); };
  const auto expect = [&](const std::string& name, const std::vector<int64_t>& want, const char* keys) {
    const auto got = shape_of(name);
    if (!got || *got == want) return;  // a missing tensor is import_hf's to report, with the others
    throw std::invalid_argument(fmt::format(
        "{}: config.json's {} give {} the shape {}, but the checkpoint's is {}: the config is not this checkpoint's",
        dir, keys, name, show(want), show(*got)));
  };
  expect("model.embed_tokens.weight", {vocab_size, hidden_size}, "vocab_size and hidden_size");
  // The layers the checkpoint holds: one past the largest index named.
  int64_t layers = 0;
  for (const std::string& name : checkpoint.names()) {
    static const std::string kPrefix = "model.layers.";
    if (!name.starts_with(kPrefix)) continue;
    const size_t end = name.find('.', kPrefix.size());
    const std::string index = name.substr(kPrefix.size(), end - kPrefix.size());
    if (index.empty() || index.size() > 9 || index.find_first_not_of("0123456789") != std::string::npos) continue;
    layers = std::max<int64_t>(layers, std::stoll(index) + 1);
  }
  if (layers > 0 && layers != num_hidden_layers) {
    throw std::invalid_argument(fmt::format("{}: config.json's num_hidden_layers is {}, but the checkpoint holds {} "
                                            "layers (model.layers.0 to {}): the config is not this checkpoint's",
                                            dir, num_hidden_layers, layers, layers - 1));
  }
  const int64_t d = resolved_head_dim();
  const std::string l0 = "model.layers.0.";
  expect(l0 + "self_attn.q_proj.weight", {num_attention_heads * d, hidden_size},
         "num_attention_heads, head_dim and hidden_size");
  expect(l0 + "self_attn.k_proj.weight", {num_key_value_heads * d, hidden_size},
         "num_key_value_heads, head_dim and hidden_size");
  expect(l0 + "mlp.gate_proj.weight", {intermediate_size, hidden_size}, "intermediate_size and hidden_size");
}

}  // namespace llama
