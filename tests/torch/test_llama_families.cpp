// Which checkpoints the Llama example reads as which function: transformers
// 5's rope_parameters read as transformers 4's keys are, Mistral's sliding
// window honoured (against the window's own definition: with RoPE's
// relative positions, a one-layer model's logits at position i are those of
// the window of tokens ending there, alone), and every key or family that
// would change the function without being honoured refused by name.
//
// Tolerance: the window computed alone has other matrix shapes and other
// absolute positions (RoPE's scores depend on the difference only up to
// rounding): a few fp32 ulps of logits ~1, 1e-5 absolute.
#include <string>

#include "config.h"
#include "llama_test_config.h"
#include "model.h"
#include "torch_doctest.h"

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
  refused(R"(, "model_type": "qwen2")", "model_type \"qwen2\" is not supported");
  refused(R"(, "model_type": "qwen3")", "model_type \"qwen3\" is not supported");
  refused(R"(, "architectures": ["MixtralForCausalLM"])", "model_type \"MixtralForCausalLM\" is not supported");
  refused(R"(, "sliding_window": 4096)", "LlamaForCausalLM has no sliding window");
  refused(R"(, "attention_dropout": 0.1)", "attention_dropout");
  refused(R"(, "partial_rotary_factor": 0.5)", "partial_rotary_factor");
  refused(R"(, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})",
          "partial_rotary_factor");
  refused(R"(, "rope_parameters": {"full_attention": {"rope_type": "default"}})", "per layer type");
  refused(R"(, "layer_types": ["full_attention"])", "\"layer_types\" changes the model");
  refused(R"(, "num_local_experts": 8)", "\"num_local_experts\" changes the model");
  refused(R"(, "rope_parameters": {"rope_type": "yarn", "factor": 4.0})", "rope_type \"yarn\" is not supported");
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
