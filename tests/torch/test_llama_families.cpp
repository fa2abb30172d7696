// Which checkpoints the Llama example reads as which function: transformers
// 5's rope_parameters read as transformers 4's keys are, Mistral's sliding
// window honoured (against the window's own definition: with RoPE's
// relative positions, a one-layer model's logits at position i are those of
// the window of tokens ending there, alone), and every key or family that
// would change the function without being honoured refused by name.
//
// Qwen2 and Qwen3 against their published configs' parameter counts and
// against modeling_qwen2.py's and modeling_qwen3.py's arithmetic written out
// with plain torch ops (the same 1e-5 absolute on logits ~1: the same sums
// in another order).
//
// Tolerance: the window computed alone has other matrix shapes and other
// absolute positions (RoPE's scores depend on the difference only up to
// rounding): a few fp32 ulps of logits ~1, 1e-5 absolute.
#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <string>

#include <sys/stat.h>
#include <unistd.h>

#include <fmt/format.h>

#include "checkpoint/temp_dir.h"
#include "config.h"
#include "llama_test_config.h"
#include "model.h"
#include "rope_reference.h"
#include "torch_doctest.h"
#include "zest/hf/hf_checkpoint.h"

namespace {

const std::string kSizes =
    R"("vocab_size": 300, "hidden_size": 16, "intermediate_size": 24, "num_hidden_layers": 1,
       "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64)";

llama::Config parse(const std::string& rest) { return llama::Config::from_json("{" + kSizes + rest + "}"); }

}  // namespace

TEST_CASE("llama config: transformers 5's rope_parameters give transformers 4's function") {
  const llama::Config v4 = parse(R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32})");
  const llama::Config v5 = parse(R"(, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 32})");
  CHECK(v5.rope_theta == 500000.0);
  CHECK(v5.rope_scaling.type == "llama3");
  CHECK(v5.rope_scaling.original_max_position_embeddings == 32);
  CHECK(llama::rope_inv_freq(v5) == llama::rope_inv_freq(v4));
  // The default rope type with its theta inside: the theta read, not 10000.
  const llama::Config plain = parse(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0})");
  CHECK(plain.rope_theta == 1000000.0);
  CHECK(plain.rope_scaling.type == "default");
  CHECK(llama::rope_inv_freq(plain) != llama::rope_inv_freq(parse("")));
  // original_max_position_embeddings still at the top level.
  CHECK(parse(R"(, "original_max_position_embeddings": 32, "rope_parameters": {"rope_type": "llama3",
      "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0})")
            .rope_scaling.original_max_position_embeddings == 32);
}

TEST_CASE("llama config: families and keys that change the function are read or refused by name") {
  const llama::Config mistral = parse(R"(, "model_type": "mistral", "sliding_window": 4)");
  CHECK(mistral.model_type == "mistral");
  CHECK(mistral.sliding_window == 4);
  const llama::Config back = llama::Config::from_json(mistral.to_json());
  CHECK(back.model_type == "mistral");
  CHECK(back.sliding_window == 4);
  CHECK(mistral.to_json().find("MistralForCausalLM") != std::string::npos);
  CHECK(parse(R"(, "architectures": ["MistralForCausalLM"], "sliding_window": null)").model_type == "mistral");
  CHECK(parse("").model_type == "llama");
  const auto refused = [](const std::string& rest, const char* what) {
    CAPTURE(rest);
    CHECK_THROWS_WITH_AS(parse(rest), doctest::Contains(what), std::invalid_argument);
  };
  refused(R"(, "model_type": "gemma")", "model_type \"gemma\" is not supported");
  refused(R"(, "model_type": "qwen2", "use_sliding_window": true)", "\"use_sliding_window\" changes the model");
  refused(R"(, "architectures": ["MixtralForCausalLM"])", "model_type \"MixtralForCausalLM\" is not supported");
  refused(R"(, "sliding_window": 4096)", "LlamaForCausalLM has no sliding window");
  refused(R"(, "attention_dropout": 0.1)", "attention_dropout");
  refused(R"(, "partial_rotary_factor": 0.5)", "partial_rotary_factor");
  refused(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})",
          "partial_rotary_factor");
  refused(R"(, "rope_parameters": {"full_attention": {"rope_type": "default"}})", "per layer type");
  refused(R"(, "layer_types": ["full_attention", "sliding_attention"])", "\"layer_types\" [");
  // transformers 5 writes the layer types it derived: all full attention is read.
  CHECK(parse(R"(, "layer_types": ["full_attention"])").model_type == "llama");
  refused(R"(, "num_local_experts": 8)", "\"num_local_experts\" changes the model");
  refused(R"(, "rope_parameters": {"rope_type": "longrope", "factor": 4.0})", "rope_type \"longrope\" is not supported");
  refused(R"(, "rope_parameters": {"rope_type": "yarn"})", "yarn scaling needs \"factor\"");
  refused(R"(, "original_max_position_embeddings": 32, "rope_parameters": {"rope_type": "yarn", "factor": 2.0,
      "original_max_position_embeddings": 16})", "give one");
  refused(R"(, "rope_parameters": {"rope_type": "linear", "factor": 2.0}, "rope_scaling": {"rope_type": "linear",
      "factor": 4.0})", "disagree");
}

TEST_CASE("mistral's sliding window: each position sees the window that ends there, and only it") {
  llama::Config c = parse(R"(, "model_type": "mistral", "sliding_window": 4)");
  const torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::randint(0, 300, {1, 12}, torch::kLong);
  llama::LlamaForCausalLM windowed(c, 3);
  const torch::Tensor full = windowed->forward(tokens);
  for (int64_t i = 3; i < 12; ++i) {
    CAPTURE(i);
    const torch::Tensor alone = windowed->forward(tokens.narrow(1, i - 3, 4));
    CHECK(torch::allclose(full.select(1, i), alone.select(1, 3), 0.0, 1e-5));
  }
  // A window as long as the sequence is no window: llama's bits.
  c.sliding_window = 12;
  llama::LlamaForCausalLM wide(c, 3);
  c.model_type = "llama";
  c.sliding_window = 0;
  llama::LlamaForCausalLM plain(c, 3);
  CHECK(torch::equal(wide->forward(tokens), plain->forward(tokens)));
  CHECK(!torch::allclose(full, plain->forward(tokens), 0.0, 1e-3));  // the window changes the function
}

namespace {

llama::Config published(const std::string& file) {
  return llama::Config::from_json_file(std::string(ZEST_SOURCE_DIR) + "/tests/tools/hf_configs/" + file);
}

}  // namespace

TEST_CASE("qwen2 and qwen3 configs: the published sizes and parameter counts, and the family's keys written back") {
  // Qwen2.5-7B: 7.62B parameters (7,615,616,512 counted from its tensors),
  // biases on q, k and v only; its sliding_window unused (use_sliding_window
  // false).
  const llama::Config q2 = published("qwen2.5_7b.json");
  CHECK(q2.model_type == "qwen2");
  CHECK(q2.resolved_head_dim() == 128);
  CHECK(q2.qkv_bias());
  CHECK_FALSE(q2.o_bias());
  CHECK_FALSE(q2.qk_norm());
  CHECK(q2.sliding_window == 0);
  CHECK(q2.rope_theta == 1000000.0);
  CHECK(q2.parameters() == 7'615'616'512);
  // Qwen3-0.6B: 596,049,920 with its tied embeddings counted once; q_norm
  // and k_norm of head_dim 128 (not hidden / heads = 64).
  const llama::Config q3 = published("qwen3_0.6b.json");
  CHECK(q3.model_type == "qwen3");
  CHECK(q3.resolved_head_dim() == 128);
  CHECK(q3.qk_norm());
  CHECK_FALSE(q3.qkv_bias());
  CHECK(q3.parameters() == 596'049'920);
  // head_dim absent: Qwen3Config's default of 128.
  CHECK(parse(R"(, "model_type": "qwen3")").resolved_head_dim() == 128);
  CHECK(parse(R"(, "model_type": "qwen2")").resolved_head_dim() == 4);
  // Written back with the family's class and keys, and read the same.
  for (const llama::Config& c : {q2, q3}) {
    const std::string text = c.to_json();
    CAPTURE(text);
    const llama::Config back = llama::Config::from_json(text);
    CHECK(back.model_type == c.model_type);
    CHECK(back.parameters() == c.parameters());
    CHECK(back.resolved_head_dim() == c.resolved_head_dim());
    CHECK(text.find("\"use_sliding_window\": false") != std::string::npos);
    CHECK(text.find("mlp_bias") == std::string::npos);  // not a key of Qwen2Config or Qwen3Config
  }
  CHECK(q2.to_json().find("Qwen2ForCausalLM") != std::string::npos);
  CHECK(q2.to_json().find("attention_bias") == std::string::npos);
  CHECK(q3.to_json().find("Qwen3ForCausalLM") != std::string::npos);
  CHECK(parse(R"(, "architectures": ["Qwen3ForCausalLM"])").model_type == "qwen3");
}

TEST_CASE("qwen2 and qwen3 forward: transformers' arithmetic written out step by step with plain torch ops") {
  for (const char* family : {"qwen2", "qwen3"}) {
    CAPTURE(family);
    llama::Config c = parse(std::string(R"(, "model_type": ")") + family + R"(", "head_dim": 6, "rope_theta": 100.0)");
    c.num_hidden_layers = 2;
    llama::LlamaForCausalLM model(c, 3);
    torch::NoGradGuard no_grad;
    auto P = model->named_parameters();
    // Qwen2's names: q, k and v biases, no o bias; Qwen3's: q_norm and k_norm.
    const bool qwen3 = std::string(family) == "qwen3";
    CHECK(P.contains("model.layers.1.self_attn.q_proj.bias") == !qwen3);
    CHECK(P.contains("model.layers.1.self_attn.v_proj.bias") == !qwen3);
    CHECK_FALSE(P.contains("model.layers.1.self_attn.o_proj.bias"));
    CHECK_FALSE(P.contains("model.layers.1.mlp.up_proj.bias"));
    CHECK(P.contains("model.layers.1.self_attn.q_norm.weight") == qwen3);
    CHECK(P.contains("model.layers.1.self_attn.k_norm.weight") == qwen3);
    int64_t count = 0;
    for (const auto& p : P) count += p.value().numel();
    CHECK(count == c.parameters());
    // Biases and norm weights away from their initial 0 and 1, so that
    // they count.
    for (const auto& p : P) {
      if (p.key().ends_with(".bias") || p.key().ends_with("_norm.weight")) p.value().normal_(1.0, 0.3);
    }
    torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(4);
    const int64_t B = 2, T = 8, H = 4, KV = 2, D = 6;
    const torch::Tensor tokens = torch::randint(300, {B, T}, gen);
    const torch::Tensor logits = model->forward(tokens);

    const auto rms = [&](const torch::Tensor& x, const std::string& w) {
      return P[w] * (x / torch::sqrt((x * x).mean(-1, true) + c.rms_norm_eps));
    };
    const auto lin = [&](const torch::Tensor& x, const std::string& m) {
      torch::Tensor y = torch::matmul(x, P[m + ".weight"].t());
      return P.contains(m + ".bias") ? y + P[m + ".bias"] : y;
    };
    const RopeReference rope(T, D, 100.0);
    torch::Tensor x = P["model.embed_tokens.weight"].index_select(0, tokens.reshape({-1})).reshape({B, T, 16});
    for (int i = 0; i < 2; ++i) {
      const std::string l = "model.layers." + std::to_string(i) + ".";
      const torch::Tensor h = rms(x, l + "input_layernorm.weight");
      // modeling_qwen3: self.q_norm(self.q_proj(hidden_states).view(hidden_shape)).transpose(1, 2)
      torch::Tensor q = lin(h, l + "self_attn.q_proj").reshape({B, T, H, D});
      torch::Tensor k = lin(h, l + "self_attn.k_proj").reshape({B, T, KV, D});
      if (qwen3) {
        q = rms(q, l + "self_attn.q_norm.weight");
        k = rms(k, l + "self_attn.k_norm.weight");
      }
      q = rope(q.permute({0, 2, 1, 3}));
      k = rope(k.permute({0, 2, 1, 3}));
      const torch::Tensor v = lin(h, l + "self_attn.v_proj").reshape({B, T, KV, D}).permute({0, 2, 1, 3});
      const torch::Tensor kk = k.repeat_interleave(H / KV, 1), vv = v.repeat_interleave(H / KV, 1);
      torch::Tensor s = torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(6.0);
      s = s + torch::full({T, T}, -1e30).triu(1);
      const torch::Tensor a = torch::matmul(torch::softmax(s, -1), vv).permute({0, 2, 1, 3}).reshape({B, T, H * D});
      x = x + lin(a, l + "self_attn.o_proj");
      const torch::Tensor g = rms(x, l + "post_attention_layernorm.weight");
      const torch::Tensor gate = lin(g, l + "mlp.gate_proj");
      x = x + lin(gate * torch::sigmoid(gate) * lin(g, l + "mlp.up_proj"), l + "mlp.down_proj");
    }
    x = rms(x, "model.norm.weight");
    const torch::Tensor want = torch::matmul(x, P["lm_head.weight"].t());
    CHECK((logits - want).abs().max().item<double>() <= 1e-5);
    CHECK(want.abs().max().item<double>() > 0.05);
  }
}

TEST_CASE("llama3 rope scaling: transformers' smoothing in fp32, bit for bit with torch's ops in its order") {
  // modeling_rope_utils._compute_llama3_parameters on the fp32 inv_freq:
  // wavelen = 2 * math.pi / inv_freq, the smooth factor and the blend, each
  // a torch op on fp32 tensors (a Python scalar over a tensor is
  // Tensor.__rtruediv__: reciprocal, then times the scalar). Llama-3.2's
  // scaling (factor 32, 1 and 4, 8192) over head_dim 64 and 128 puts
  // several frequencies in the smoothed band.
  for (int64_t head_dim : {64, 128}) {
    CAPTURE(head_dim);
    llama::Config c = parse(R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
        "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})");
    c.head_dim = head_dim;
    llama::Config plain = c;
    plain.rope_scaling = {};
    const torch::Tensor inv_freq = torch::tensor(llama::rope_inv_freq(plain), torch::kFloat);
    const double pi = 3.141592653589793, factor = 32.0, low = 1.0, high = 4.0, old_len = 8192;
    const double low_wavelen = old_len / low, high_wavelen = old_len / high;
    const torch::Tensor wavelen = inv_freq.reciprocal() * (2 * pi);
    torch::Tensor inv_llama = torch::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
    const torch::Tensor smooth = (wavelen.reciprocal() * old_len - low) / (high - low);
    const torch::Tensor smoothed = (1 - smooth) * inv_llama / factor + smooth * inv_llama;
    const torch::Tensor medium = (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
    inv_llama = torch::where(medium, smoothed, inv_llama);
    const torch::Tensor got = torch::tensor(llama::rope_inv_freq(c), torch::kFloat);
    CHECK(medium.sum().item<int64_t>() >= 2);
    CHECK(torch::equal(got, inv_llama));
  }
}

TEST_CASE("yarn rope scaling: transformers 5's frequencies and attention factor, bit for bit with torch's ops") {
  // _compute_yarn_parameters: the correction range in Python's doubles, the
  // ramp and the blend as torch ops on fp32 tensors. Qwen2.5's long-context
  // recipe (factor 4 over 32768 at theta 1e6, head_dim 128) and DeepSeek's
  // mscale form (factor 40 over 4096, mscale = mscale_all_dim = 0.707).
  struct Case {
    const char* scaling;
    double theta, factor, original;
    int64_t dim;
    double mscale, mscale_all_dim;
  };
  for (const Case& k : {Case{R"("factor": 4.0, "original_max_position_embeddings": 32768)", 1e6, 4.0, 32768, 128, 0, 0},
                        Case{R"("factor": 40.0, "original_max_position_embeddings": 4096, "mscale": 0.707,
                               "mscale_all_dim": 0.707, "beta_fast": 32, "beta_slow": 1)",
                             10000.0, 40.0, 4096, 64, 0.707, 0.707}}) {
    CAPTURE(k.scaling);
    llama::Config c = parse(fmt::format(R"(, "rope_theta": {}, "rope_parameters": {{"rope_type": "yarn", {}}})",
                                        k.theta, k.scaling));
    c.head_dim = k.dim;
    const double pi = 3.141592653589793;
    const auto correction_dim = [&](double rotations) {
      return (k.dim * std::log(k.original / (rotations * 2 * pi))) / (2 * std::log(k.theta));
    };
    const double low = std::max(std::floor(correction_dim(32)), 0.0);
    const double high = std::min(std::ceil(correction_dim(1)), static_cast<double>(k.dim - 1));
    const torch::Tensor pos_freqs =
        torch::pow(k.theta, torch::arange(0, k.dim, 2).to(torch::kFloat) / static_cast<double>(k.dim));
    const torch::Tensor extrapolation = 1.0 / pos_freqs, interpolation = 1.0 / (k.factor * pos_freqs);
    const torch::Tensor ramp = ((torch::arange(k.dim / 2, torch::kFloat) - low) / (high - low)).clamp(0, 1);
    const torch::Tensor factor = 1 - ramp;
    const torch::Tensor want = interpolation * (1 - factor) + extrapolation * factor;
    CHECK(torch::equal(torch::tensor(llama::rope_inv_freq(c), torch::kFloat), want));
    const auto mscale = [](double s, double m) { return s <= 1 ? 1.0 : 0.1 * m * std::log(s) + 1.0; };
    const double attention = k.mscale != 0 ? mscale(k.factor, k.mscale) / mscale(k.factor, k.mscale_all_dim)
                                           : mscale(k.factor, 1.0);
    CHECK(llama::rope_attention_scaling(c) == attention);
    // cos and sin scaled by it in fp32 before the cast.
    const llama::Rotary r = llama::rotary(c, 5, torch::kFloat, torch::kCPU);
    const torch::Tensor t = torch::arange(5, torch::kFloat);
    const torch::Tensor freqs = torch::matmul(want.unsqueeze(1), t.unsqueeze(0)).transpose(0, 1);
    const torch::Tensor emb = torch::cat({freqs, freqs}, -1);
    CHECK(torch::equal(r.cos, emb.cos() * static_cast<float>(attention)));
    CHECK(torch::equal(r.sin, emb.sin() * static_cast<float>(attention)));
  }
  // The context is factor x the original length: a yarn model takes
  // sequences past max_position_embeddings (64 here) up to 2 x 64.
  llama::Config c = parse(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 2.0})");
  CHECK(c.rope_scaling.original_max_position_embeddings == 64);
  llama::LlamaForCausalLM model(c, 1);
  const torch::NoGradGuard no_grad;
  CHECK(model->forward(torch::zeros({1, 128}, torch::kLong)).size(1) == 128);
  CHECK_THROWS_WITH_AS(model->forward(torch::zeros({1, 129}, torch::kLong)), doctest::Contains("longer than"),
                       std::invalid_argument);
  llama::LlamaForCausalLM plain(parse(""), 1);
  CHECK_THROWS_WITH_AS(plain->forward(torch::zeros({1, 65}, torch::kLong)), doctest::Contains("longer than"),
                       std::invalid_argument);
}

TEST_CASE("dynamic rope scaling: transformers' growing and reset lengths, and its fp32 base, bit for bit") {
  llama::Config c = parse(R"(, "rope_theta": 500000.0, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0})");
  c.head_dim = 16;
  // dynamic_rope_update: the longest batch so far past max_position_embeddings
  // (64), back to the original frequencies below it.
  int64_t cached = c.max_position_embeddings;
  CHECK(llama::rope_dynamic_length(c, 40, cached) == 64);
  CHECK(llama::rope_dynamic_length(c, 100, cached) == 100);
  CHECK(llama::rope_dynamic_length(c, 80, cached) == 100);  // kept: not below the original length
  CHECK(llama::rope_dynamic_length(c, 64, cached) == 100);
  CHECK(llama::rope_dynamic_length(c, 63, cached) == 64);   // reset
  // Within max_position_embeddings: the default frequencies exactly.
  llama::Config plain = c;
  plain.rope_scaling = {};
  CHECK(llama::rope_inv_freq(c, 64) == llama::rope_inv_freq(plain));
  // Past it: _compute_dynamic_ntk_parameters with seq_len a tensor
  // (max(position_ids) + 1), every step an fp32 op.
  for (int64_t len : {65, 100, 1000}) {
    CAPTURE(len);
    const torch::Tensor seq = torch::tensor(len, torch::kLong);
    const torch::Tensor base = 500000.0 * ((2.0 * seq / 64) - (2.0 - 1)).pow(16.0 / 14.0);
    const torch::Tensor want = 1.0 / base.pow(torch::arange(0, 16, 2, torch::kLong).to(torch::kFloat) / 16);
    CHECK(torch::equal(torch::tensor(llama::rope_inv_freq(c, len), torch::kFloat), want));
  }
  // The model keeps the length between forwards: 80 tokens after 100 use
  // the frequencies of 100, not those of a first batch of 80; a batch
  // shorter than 64 resets them.
  llama::LlamaForCausalLM grown(c, 1), fresh(c, 1);
  const torch::NoGradGuard no_grad;
  const torch::Tensor tokens = torch::randint(0, 300, {1, 80}, torch::kLong);
  const torch::Tensor first = fresh->forward(tokens);
  const torch::Tensor short_tokens = tokens.narrow(1, 0, 40);
  const torch::Tensor short_first = fresh->forward(short_tokens);
  grown->forward(torch::zeros({1, 100}, torch::kLong));
  CHECK_FALSE(torch::allclose(grown->forward(tokens), first, 0.0, 1e-6));
  CHECK(torch::equal(grown->forward(short_tokens), short_first));
  CHECK(torch::equal(grown->forward(tokens), first));  // after the reset, as a first batch of 80
}

TEST_CASE("llama config.json: a FIFO or a device is refused at once, and sizes out of bounds or null by name") {
  const std::string dir = std::filesystem::temp_directory_path() / fmt::format("zest_llama_fifo_{}", ::getpid());
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/config.json";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  // Nobody writes the FIFO: a blocking open would never return.
  CHECK_THROWS_WITH_AS(llama::Config::from_json_file(fifo), doctest::Contains("config.json"), std::invalid_argument);
  CHECK_THROWS_WITH_AS(llama::Config::from_json_file("/dev/zero"), doctest::Contains("/dev/zero"),
                       std::invalid_argument);
  std::filesystem::remove_all(dir);
  // kSizes with one size replaced.
  const auto refused = [](const std::string& key, const std::string& value, const char* what) {
    std::string sizes = "{" + kSizes + "}";
    const size_t at = sizes.find("\"" + key + "\": ");
    REQUIRE(at != std::string::npos);
    const size_t begin = at + key.size() + 4, end = sizes.find_first_of(",}", begin);
    sizes.replace(begin, end - begin, value);
    CAPTURE(sizes);
    CHECK_THROWS_WITH_AS(llama::Config::from_json(sizes), doctest::Contains(what), std::invalid_argument);
  };
  // A billion layers would be built 40 a second before any tensor is read.
  refused("num_hidden_layers", "1000000000", "num_hidden_layers is 1000000000; at most 4096");
  refused("hidden_size", "1099511627776", "hidden_size is 1099511627776; at most 131072");
  refused("intermediate_size", "18446744073709551615", "\"intermediate_size\" is 18446744073709551615, out of range");
  refused("hidden_size", "null", "\"hidden_size\" is null");
}

TEST_CASE("llama: config.json's sizes are checked against the checkpoint's shapes before anything is built") {
  zest::test::TempDir dir;
  const std::string command =
      fmt::format("python3 {}/tests/tools/hf_llama_writer.py write --dtype bf16 --layers 3 --hidden 16 --intermediate 24 "
                  "--vocab 256 {} > /dev/null",
                  ZEST_SOURCE_DIR, dir.str());
  REQUIRE(std::system(command.c_str()) == 0);
  const zest::HfCheckpoint ckpt = zest::HfCheckpoint::open(dir.str());
  const llama::Config good = llama::Config::from_json_file(dir / "config.json");
  CHECK_NOTHROW(good.check_shapes(ckpt, dir.str()));
  const auto refused = [&](auto change, const std::string& message) {
    llama::Config c = good;
    change(c);
    CHECK_THROWS_WITH_AS(c.check_shapes(ckpt, dir.str()), doctest::Contains(message.c_str()), std::invalid_argument);
  };
  refused([](llama::Config& c) { c.num_hidden_layers = 1000; },
          "num_hidden_layers is 1000, but the checkpoint holds 3 layers");
  refused([](llama::Config& c) { c.vocab_size = 300; }, "vocab_size and hidden_size give model.embed_tokens.weight");
  refused([](llama::Config& c) { c.intermediate_size = 32; }, "intermediate_size and hidden_size give");
  refused([](llama::Config& c) { c.num_key_value_heads = 2; }, "num_key_value_heads, head_dim and hidden_size");
  refused([](llama::Config& c) { c.head_dim = 8; }, "num_attention_heads, head_dim and hidden_size");
}
