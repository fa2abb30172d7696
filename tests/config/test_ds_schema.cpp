// Every key of DeepSpeed's current config schema (config/ds_schema_keys.h,
// generated from its source by scripts/ds_config_keys.py) is one the
// reader knows: honoured, noted as ignored with its reason, or refused by
// name; none is "unknown", and none is noted as a key DeepSpeed ignores.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "config_test_helpers.h"
#include "zest/config/ds_schema_keys.h"

using namespace zest;
using nlohmann::json;

namespace {

// {"a": {"b": {key: null}}} for section "a.b", with what makes the section
// read at all (offload sections at stage 3 with device cpu).
json with_key(const std::string& section, const std::string& key) {
  json doc = json::object();
  json* at = &doc;
  size_t start = 0;
  while (!section.empty() && start <= section.size()) {
    const size_t dot = section.find('.', start);
    const std::string part = section.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (part == "zero_optimization") (*at)[part]["stage"] = 3;
    if (part.starts_with("offload_")) (*at)[part]["device"] = "cpu";
    at = &(*at)[part];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  if (!at->is_object()) *at = json::object();
  (*at)[key] = nullptr;
  if (key == "offload_param" && section == "zero_optimization") doc[section]["offload_optimizer"]["device"] = "cpu";
  return doc;
}

}  // namespace

TEST_CASE("the generated schema is DeepSpeed's, read at a recorded commit") {
  CHECK(std::string(config_detail::kDeepSpeedSchemaCommit).size() == 40);
  size_t keys = 0;
  bool zenflow = false, leaf = false, autocast = false;
  for (const auto& section : config_detail::kDeepSpeedSchema) {
    for (const char* k : section.keys) {
      ++keys;
      const std::string path = std::string(section.path) + "." + k;
      zenflow |= path == "zero_optimization.zenflow";
      leaf |= path == "zero_optimization.leaf_module";
      autocast |= path == ".torch_autocast";
    }
  }
  CHECK(keys > 150);
  CHECK(zenflow);
  CHECK(leaf);
  CHECK(autocast);
}

TEST_CASE("every key of DeepSpeed's schema is known to the reader") {
  const AutoValues program = test::ds_config_program();
  for (const auto& section : config_detail::kDeepSpeedSchema) {
    for (const char* key : section.keys) {
      const std::string path = std::string(section.path).empty() ? key : std::string(section.path) + "." + key;
      CAPTURE(path);
      const std::string text = with_key(section.path, key).dump();
      std::string error = "no error";
      EngineConfig c;
      try {
        c = parse_config_json(text, program);
      } catch (const Error& e) {
        error = e.message();
      }
      CHECK(error.find("unknown key") == std::string::npos);
      CHECK(error.find("does not handle") == std::string::npos);
      CHECK(test::ignored_reason(c, path).find("does not read this key") == std::string::npos);
    }
  }
}

TEST_CASE("keys of DeepSpeed's schema that were refused as unknown are now known, with their reasons") {
  const AutoValues program = test::ds_config_program();
  const EngineConfig c = parse_config_json(R"({"zero_optimization": {"stage": 3, "allgather_sequential": true,
      "enable_sanity_checks": true, "save_muon_momentum_buffer_in_memory": false,
      "leaf_module": {"classes": ["MixtralSparseMoeBlock"]}},
      "log_level": "info", "vocabulary_size": 50257, "seq_parallel_communication_data_type": "fp32",
      "torch_autocast": {"enabled": false}, "managed_gradient_accumulation": true,
      "bf16": {"enabled": true, "check_grad_overflow": true, "bf16_master_weights_and_grads": false}})",
                                           program);
  CHECK(test::ignored_reason(c, "zero_optimization.allgather_sequential").find("one by one") != std::string::npos);
  CHECK(test::ignored_reason(c, "zero_optimization.enable_sanity_checks").find("debugging") != std::string::npos);
  CHECK(test::ignored_reason(c, "zero_optimization.save_muon_momentum_buffer_in_memory").find("Muon") !=
        std::string::npos);
  CHECK(test::ignored_reason(c, "zero_optimization.leaf_module").find("units you register") != std::string::npos);
  CHECK(test::ignored_reason(c, "vocabulary_size").find("tensor-core") != std::string::npos);
  CHECK(test::ignored_reason(c, "seq_parallel_communication_data_type").find("sequence") != std::string::npos);
  CHECK(test::ignored_reason(c, "torch_autocast") == "torch_autocast is off");
  CHECK(test::ignored_reason(c, "bf16.check_grad_overflow") == "true, as in ZEST");
  // A misspelt key inside leaf_module (a pydantic model) is still refused.
  CHECK(test::error_of(R"({"zero_optimization": {"leaf_module": {"clases": []}}})", program)
            .find("unknown key 'zero_optimization.leaf_module.clases' in zero_optimization.leaf_module (did you "
                  "mean 'classes'?)") != std::string::npos);
}

TEST_CASE("keys DeepSpeed acts on that ask for what ZEST lacks are refused by name") {
  const AutoValues program = test::ds_config_program();
  auto error = [&](const std::string& text) { return test::error_of(text, program); };
  CHECK(error(R"({"zero_optimization": {"stage": 2, "zenflow": {"topk_ratio": 0.1}}})")
            .find("ZenFlow") != std::string::npos);
  CHECK(error(R"({"torch_autocast": {"enabled": true, "dtype": "bfloat16"}})").find("torch.autocast") !=
        std::string::npos);
  CHECK(error(R"({"gradient_allreduce_op": "SUM"})").find("gradient_allreduce_op is \"sum\": that asks for summed "
                                                          "gradients") != std::string::npos);
  CHECK(error(R"({"gradient_allreduce_op": "mean"})") == "no error");
  CHECK(error(R"({"sequence_parallel_size": 4})").find("Ulysses sequence parallelism") != std::string::npos);
  CHECK(error(R"({"sequence_parallel_size": 1})") == "no error");
  CHECK(error(R"({"gradient_allreduce_op": "max"})").find("allowed: mean, sum") != std::string::npos);
  // bf16 master weights and optimizer state are honoured (the Engine
  // checks DeepSpeed's rules for them: tests/engine/test_engine_bf16_master.cpp).
  const EngineConfig bf16_master = parse_config_json(
      R"({"zero_optimization": {"stage": 2}, "bf16": {"enabled": true, "bf16_master_weights_and_grads": true,
          "bf16_optimizer_states": "true"}})",
      program);
  CHECK(bf16_master.bf16_master_weights_and_grads);
  CHECK(bf16_master.bf16_optimizer_states);  // pydantic's coercion of "true"
  CHECK(bf16_master.master_dtype() == DType::kBFloat16);
  CHECK(bf16_master.optimizer_state_dtype() == DType::kBFloat16);
  CHECK(error(R"({"bf16": {"enabled": true, "bf16_optimizer_states": 3}})").find("bf16.bf16_optimizer_states") !=
        std::string::npos);
  CHECK(error(R"({"bf16": {"enabled": true, "check_grad_overflow": false}})")
            .find("applying steps whose gradients are not finite") != std::string::npos);
  CHECK(error(R"({"expert_parallel": {"enabled": true, "autoep_size": 8}})").find("expert (MoE) parallelism") !=
        std::string::npos);
  CHECK(error(R"({"expert_parallel": {"autoep_size": 8}})") == "no error");  // "enabled" defaults to false
  CHECK(error(R"({"managed_gradient_accumulation": false})").find("an optimizer update at every step()") !=
        std::string::npos);
}
