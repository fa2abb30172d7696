// The Llama example's model (examples/llama): LlamaForCausalLM's parameter
// names and shapes, config.json as LlamaConfig reads and writes it, a
// forward against the same arithmetic written out with plain torch ops,
// and training through zest::TorchModule: the same losses bit for bit at
// stages 0-3, and with LoRA only the adapters change.
//
// Tolerance: the reference computes the same sums as the model in another
// order (repeat_interleave and an explicit cos/sin table, matmul against
// addmm), a few fp32 ulps of logits ~1, so 1e-5 absolute.
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "config.h"
#include "llama_test_config.h"
#include "model.h"
#include "rope_reference.h"
#include "torch_doctest.h"
#include "trainer.h"
#include "zest/comm/inprocess_comm.h"
#include "zest/core/check.h"
#include "zest/memory/raw_allocator.h"

namespace test_llama_example {

namespace {

llama::Config tiny(bool tied) { return llama_test_config(tied); }

std::vector<std::pair<std::string, std::vector<int64_t>>> names_and_shapes(llama::LlamaForCausalLMImpl& m) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value().sizes().vec());
  return out;
}

}  // namespace

TEST_CASE("llama model: LlamaForCausalLM's parameter names and shapes, untied and tied") {
  using Shapes = std::vector<std::pair<std::string, std::vector<int64_t>>>;
  Shapes want = {{"model.embed_tokens.weight", {260, 16}}};
  for (int i = 0; i < 2; ++i) {
    const std::string l = "model.layers." + std::to_string(i) + ".";
    const Shapes layer = {{l + "input_layernorm.weight", {16}},
                          {l + "self_attn.q_proj.weight", {24, 16}},
                          {l + "self_attn.k_proj.weight", {12, 16}},
                          {l + "self_attn.v_proj.weight", {12, 16}},
                          {l + "self_attn.o_proj.weight", {16, 24}},
                          {l + "post_attention_layernorm.weight", {16}},
                          {l + "mlp.gate_proj.weight", {24, 16}},
                          {l + "mlp.up_proj.weight", {24, 16}},
                          {l + "mlp.down_proj.weight", {16, 24}}};
    want.insert(want.end(), layer.begin(), layer.end());
  }
  want.push_back({"model.norm.weight", {16}});
  llama::LlamaForCausalLM tied(tiny(true), 1);
  CHECK(names_and_shapes(*tied) == want);
  CHECK(tied->units().size() == 3);  // two layers and the norm; embeddings and head are "<root>"
  want.push_back({"lm_head.weight", {260, 16}});
  llama::LlamaForCausalLM untied(tiny(false), 1);
  CHECK(names_and_shapes(*untied) == want);
  CHECK(untied->units().size() == 5);
  int64_t count = 0;
  for (const auto& p : untied->parameters()) count += p.numel();
  CHECK(count == tiny(false).parameters());

  llama::Config biased = tiny(false);
  biased.attention_bias = true;
  biased.mlp_bias = true;
  llama::LlamaForCausalLM b(biased, 1);
  const auto named = b->named_parameters();
  CHECK(named.contains("model.layers.1.self_attn.k_proj.bias"));
  CHECK(named["model.layers.1.mlp.down_proj.bias"].sizes() == torch::IntArrayRef({16}));
  count = 0;
  for (const auto& p : b->parameters()) count += p.numel();
  CHECK(count == biased.parameters());

  // HF's initialization: norms 1, Linear weights N(0, 0.02); blocks drawn
  // by index, whatever made them.
  CHECK(torch::equal(untied->model->norm->weight, torch::ones({16})));
  const double std = untied->model->layers["1"]->named_parameters()["mlp.up_proj.weight"].std().item<double>();
  CHECK(std == doctest::Approx(0.02).epsilon(0.2));
  const llama::LlamaDecoderLayer alone = llama::make_block(tiny(false), 1, 1);
  CHECK(torch::equal(alone->mlp->up_proj->weight, untied->layers()[1]->mlp->up_proj->weight));
}

TEST_CASE("llama config.json: LlamaConfig's keys and defaults, refused kinds named") {
  // Llama-3.2-1B's config.json.
  const std::string text = R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})";
  const llama::Config c = llama::Config::from_json(text);
  CHECK(c.vocab_size == 128256);
  CHECK(c.num_key_value_heads == 8);
  CHECK(c.resolved_head_dim() == 64);
  CHECK(c.rms_norm_eps == 1e-5);
  CHECK(c.rope_theta == 500000.0);
  CHECK(c.rope_scaling.type == "llama3");
  CHECK(c.rope_scaling.factor == 32.0);
  CHECK(c.tie_word_embeddings);
  CHECK(c.torch_dtype == "bfloat16");
  CHECK(c.parameters() == 1235814400);  // Llama-3.2-1B, tied
  const llama::Config again = llama::Config::from_json(c.to_json());
  CHECK(again.to_json() == c.to_json());
  CHECK(again.rope_scaling.original_max_position_embeddings == 8192);

  // llama3 scaling: the low frequencies divided by the factor, the high ones kept.
  const std::vector<float> inv = llama::rope_inv_freq(c);
  REQUIRE(inv.size() == 32);
  CHECK(inv[0] == 1.0f);
  CHECK(inv[31] == doctest::Approx(1.0 / std::pow(500000.0, 62.0 / 64.0) / 32.0).epsilon(1e-5));

  // Absent keys take LlamaConfig's defaults; num_key_value_heads null = heads.
  const llama::Config d = llama::Config::from_json(
      R"({"vocab_size": 300, "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 1,
          "num_attention_heads": 4, "num_key_value_heads": null})");
  CHECK(d.num_key_value_heads == 4);
  CHECK(d.resolved_head_dim() == 16);
  CHECK(d.rms_norm_eps == 1e-6);
  CHECK(d.torch_dtype == "float32");
  CHECK(llama::Config::from_json(R"({"vocab_size": 300, "hidden_size": 64, "intermediate_size": 100,
      "num_hidden_layers": 1, "num_attention_heads": 4, "dtype": "bfloat16"})").torch_dtype == "bfloat16");
  CHECK_FALSE(d.tie_word_embeddings);

  const auto refused = [&](const std::string& json, const char* message) {
    CAPTURE(json);
    CHECK_THROWS_WITH_AS(llama::Config::from_json(json, "cfg"), doctest::Contains(message), std::invalid_argument);
  };
  const std::string sizes = R"("vocab_size": 300, "hidden_size": 64, "intermediate_size": 100, "num_hidden_layers": 1, )";
  refused("{" + sizes + R"("num_attention_heads": 4, "rope_scaling": {"rope_type": "longrope", "factor": 4.0}})",
          "rope_type \"longrope\" is not supported");
  refused("{" + sizes + R"("num_attention_heads": 4, "rope_scaling": {"type": "dynamic"}})",
          "dynamic scaling needs \"factor\"");
  refused("{" + sizes + R"("num_attention_heads": 4, "hidden_act": "gelu"})", "hidden_act \"gelu\" is not supported");
  refused("{" + sizes + R"("num_attention_heads": 3, "num_key_value_heads": 2})", "not a multiple of num_key_value_heads");
  refused(R"({"vocab_size": 300})", "\"hidden_size\" is missing");
  refused("{" + sizes + R"("num_attention_heads": "4"})", "\"num_attention_heads\" must be a whole number");
  refused("[1, 2]", "expected a JSON object");
  refused("{", "not valid JSON");
}

TEST_CASE("llama forward: HF's arithmetic written out step by step with plain torch ops") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    llama::Config c = tiny(tied);
    c.rope_theta = 100.0;  // positions 0-7 turn the slow pairs too
    llama::LlamaForCausalLM model(c, 3);
    // Nonzero adapters on two layers' projections: the forward includes them.
    zest::LoraOptions lora;
    lora.r = 2;
    lora.alpha = 4;
    llama::enable_lora(*model, lora, 5);
    torch::NoGradGuard no_grad;
    for (const auto& p : model->named_parameters()) {
      if (p.key().ends_with("lora_B.weight")) p.value().normal_(0.0, 0.1);
    }
    torch::Generator gen = torch::make_generator<torch::CPUGeneratorImpl>(4);
    const torch::Tensor tokens = torch::randint(256, {2, 8}, gen);
    const torch::Tensor logits = model->forward(tokens);

    auto P = model->named_parameters();
    const int64_t T = 8, H = 4, KV = 2, D = 6;
    const auto rms = [&](const torch::Tensor& x, const std::string& w) {
      return P[w] * (x / torch::sqrt((x * x).mean(-1, true) + c.rms_norm_eps));
    };
    const auto lin = [&](const torch::Tensor& x, const std::string& m) {
      torch::Tensor y = torch::matmul(x, P[m + ".weight"].t());
      if (P.contains(m + ".lora_A.weight")) {
        y = y + 2.0 * torch::matmul(torch::matmul(x, P[m + ".lora_A.weight"].t()), P[m + ".lora_B.weight"].t());
      }
      return y;
    };
    const RopeReference rope(T, D, 100.0);
    torch::Tensor x = P["model.embed_tokens.weight"].index_select(0, tokens.reshape({-1})).reshape({2, T, 16});
    for (int i = 0; i < 2; ++i) {
      const std::string l = "model.layers." + std::to_string(i) + ".";
      const torch::Tensor h = rms(x, l + "input_layernorm.weight");
      const torch::Tensor q = rope(lin(h, l + "self_attn.q_proj").reshape({2, T, H, D}).permute({0, 2, 1, 3}));
      const torch::Tensor k = rope(lin(h, l + "self_attn.k_proj").reshape({2, T, KV, D}).permute({0, 2, 1, 3}));
      const torch::Tensor v = lin(h, l + "self_attn.v_proj").reshape({2, T, KV, D}).permute({0, 2, 1, 3});
      const torch::Tensor kk = k.repeat_interleave(H / KV, 1), vv = v.repeat_interleave(H / KV, 1);
      torch::Tensor s = torch::matmul(q, kk.transpose(-1, -2)) / std::sqrt(6.0);
      s = s + torch::full({T, T}, -1e30).triu(1);
      const torch::Tensor a = torch::matmul(torch::softmax(s, -1), vv).permute({0, 2, 1, 3}).reshape({2, T, H * D});
      x = x + lin(a, l + "self_attn.o_proj");
      const torch::Tensor g = rms(x, l + "post_attention_layernorm.weight");
      const torch::Tensor gate = lin(g, l + "mlp.gate_proj");
      x = x + lin(gate * torch::sigmoid(gate) * lin(g, l + "mlp.up_proj"), l + "mlp.down_proj");
    }
    x = rms(x, "model.norm.weight");
    const torch::Tensor want = torch::matmul(x, P[tied ? "model.embed_tokens.weight" : "lm_head.weight"].t());
    CHECK(logits.sizes() == torch::IntArrayRef({2, T, 260}));
    CHECK((logits - want).abs().max().item<double>() <= 1e-5);
    CHECK(want.abs().max().item<double>() > 0.05);  // not vanishingly small

    // Causal: changing the last token leaves the earlier logits alone.
    torch::Tensor other = tokens.clone();
    other[0][T - 1] = (other[0][T - 1].item<int64_t>() + 1) % 256;
    const torch::Tensor changed = model->forward(other);
    CHECK(torch::equal(changed.slice(1, 0, T - 1), logits.slice(1, 0, T - 1)));
    CHECK_FALSE(torch::equal(changed, logits));
  }
}

namespace {

std::string fortunes() {
  std::string out;
  for (int i = 0; i < 30; ++i) {
    out += "Fortune " + std::to_string(i) + ": a quiet mind hears the rain on the roof.\n%\n";
  }
  return out;
}

struct Run {
  std::vector<float> losses;  // rank 0's
  double val_loss = 0.0;
  std::map<std::string, std::vector<float>> masters;
  std::vector<bool> frozen_units;
};

Run train(int stage, int world, int64_t lora_r, int64_t persistence_threshold, bool tied = false) {
  const examples::Corpus corpus = examples::Corpus::from_text(fortunes());
  std::vector<Run> runs(static_cast<size_t>(world));
  zest::run_inprocess(world, [&](zest::Communicator& comm) {
    torch::set_num_threads(1);
    zest::CachingAllocator alloc(zest::make_host_allocator());
    zest::EngineConfig config;
    config.zero.stage = stage;
    config.zero.stage3_param_persistence_threshold = persistence_threshold;
    config.zero.reduce_bucket_size = 500;
    config.optimizer.lr = 1e-2f;
    zest::Engine engine(config, comm, alloc, zest::Stream::default_for(comm.device()));
    llama::LlamaForCausalLM model(tiny(tied), 9);
    if (lora_r > 0) {
      zest::LoraOptions lora;
      lora.r = lora_r;
      lora.alpha = 16;
      llama::enable_lora(*model, lora, 9);
    }
    const auto zt = llama::wrap(engine, model);
    Run& r = runs[static_cast<size_t>(comm.rank())];
    const int64_t rows = 4 / world;
    for (int64_t s = 0; s < 4; ++s) {
      const llama::MicroStep m =
          llama::train_micro_step(*zt, *model, corpus.train_batch(s, comm.rank() * rows, rows, 12, 3));
      REQUIRE(m.result.applied);
      r.losses.push_back(m.loss);
    }
    r.val_loss = llama::validation_loss(*zt, *model, corpus, 2, 12);
    for (const zest::UnitLayout& u : engine.layout().units()) {
      r.frozen_units.push_back(u.frozen);
      for (const zest::ParamLayout& q : u.params) r.masters[q.name] = engine.param_master(q.name);
    }
  });
  return runs[0];
}

}  // namespace

TEST_CASE("llama training: stages 0-3 give the same losses and parameters, bit for bit") {
  for (bool tied : {false, true}) {
    CAPTURE(tied);
    const Run first = train(0, 2, 0, 0, tied);
    CHECK(first.losses.back() < first.losses.front());
    for (int stage : {1, 2, 3}) {
      CAPTURE(stage);
      const Run r = train(stage, 2, 0, 0, tied);
      CHECK(r.losses == first.losses);
      CHECK(r.val_loss == first.val_loss);
      CHECK(r.masters == first.masters);
    }
  }
}

namespace {

void check_lora_trains_adapters_only(const std::vector<int>& stages, int64_t persistence_threshold) {
  llama::LlamaForCausalLM base(tiny(false), 9);
  std::map<std::string, std::vector<float>> initial;
  for (const auto& p : base->named_parameters()) {
    const torch::Tensor t = p.value().detach().contiguous();
    initial[p.key()] = std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel());
  }
  std::optional<Run> first;
  for (int stage : stages) {
    CAPTURE(stage);
    const Run r = train(stage, 2, 4, persistence_threshold);
    int adapters = 0;
    for (const auto& [name, values] : r.masters) {
      CAPTURE(name);
      if (name.find(".lora_") != std::string::npos) {
        ++adapters;
        if (name.ends_with("lora_B.weight")) CHECK(values != std::vector<float>(values.size(), 0.0f));  // trained
      } else {
        CHECK(values == initial.at(name));  // frozen, bit for bit
      }
    }
    CHECK(adapters == 2 * 2 * 7);  // two layers, seven projections, A and B
    // Per layer: the adapters, then the frozen base; the norm, embeddings, head frozen.
    CHECK(r.frozen_units == std::vector<bool>{true, false, true, false, true, true, true});
    if (!first) {
      first = r;
      continue;
    }
    CHECK(r.losses == first->losses);
    CHECK(r.masters == first->masters);
  }
}

}  // namespace

TEST_CASE("llama --lora: only the adapters train, stages 0-3 (units kept whole at stage 3) bit for bit") {
  check_lora_trains_adapters_only({0, 1, 2, 3}, int64_t{1} << 30);
}

TEST_CASE("llama --lora at stage 3 with every unit sharded: as stage 0, bit for bit") {
  check_lora_trains_adapters_only({0, 3}, 0);
}

}  // namespace test_llama_example
