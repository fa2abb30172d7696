// A small Llama, registered with LlamaForCausalLM's names, and checkpoint
// directories of it written by tests/tools/hf_llama_writer.py (an
// independent writer: Python's standard library only), for the hf tests.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "checkpoint/temp_dir.h"
#include "engine/engine_harness.h"
#include "error_of.h"

namespace zest::test {

struct TinyLlama {
  int layers = 2;
  int64_t hidden = 24;
  int64_t intermediate = 40;
  int64_t vocab = 67;
  // > 0: each layer's q_proj has LoRA adapters of this rank
  // (self_attn.q_proj.lora_A.weight [r, hidden], lora_B [hidden, r]).
  int64_t lora_rank = 0;
};

// Units: the embedding, one per layer, then the final norm and the head.
// `prefix` stands for the checkpoint's "model." (the head is "lm_head.").
inline void register_llama(Engine& engine, const TinyLlama& m = {}, const std::string& prefix = "model.") {
  engine.add_param_group("no_decay", 0.0f);
  engine.add_unit("embed", {{prefix + "embed_tokens.weight", {m.vocab, m.hidden}}});
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = fmt::format("{}layers.{}.", prefix, l);
    engine.add_unit(fmt::format("layer{}", l),
                    {{p + "input_layernorm.weight", {m.hidden}, "no_decay"},
                     {p + "self_attn.q_proj.weight", {m.hidden, m.hidden}},
                     {p + "self_attn.k_proj.weight", {m.hidden, m.hidden}},
                     {p + "self_attn.v_proj.weight", {m.hidden, m.hidden}},
                     {p + "self_attn.o_proj.weight", {m.hidden, m.hidden}},
                     {p + "post_attention_layernorm.weight", {m.hidden}, "no_decay"},
                     {p + "mlp.gate_proj.weight", {m.intermediate, m.hidden}},
                     {p + "mlp.up_proj.weight", {m.intermediate, m.hidden}},
                     {p + "mlp.down_proj.weight", {m.hidden, m.intermediate}}});
    if (m.lora_rank > 0) {
      engine.add_unit(fmt::format("layer{}.lora", l),
                      {{p + "self_attn.q_proj.lora_A.weight", {m.lora_rank, m.hidden}},
                       {p + "self_attn.q_proj.lora_B.weight", {m.hidden, m.lora_rank}}});
    }
  }
  engine.add_unit("head", {{prefix + "norm.weight", {m.hidden}, "no_decay"}, {"lm_head.weight", {m.vocab, m.hidden}}});
}

// What the writer puts in element i of `name` (its docstring): exact in
// bf16, fp16 and fp32.
inline float writer_value(const std::string& name, size_t i) {
  uint64_t h = 0;
  for (const unsigned char c : name) h = (31 * h + c) % (uint64_t{1} << 32);
  h %= 255;
  return static_cast<float>((static_cast<int64_t>((h + 7919 * i) % 255) - 127)) / 64.0f;
}

inline std::vector<float> writer_values(const std::string& name, size_t numel) {
  std::vector<float> v(numel);
  for (size_t i = 0; i < numel; ++i) v[i] = writer_value(name, i);
  return v;
}

// Every tensor of the writer's checkpoint of `m`: name -> numel.
inline std::map<std::string, size_t> llama_numels(const TinyLlama& m = {}) {
  std::map<std::string, size_t> out;
  const auto h = static_cast<size_t>(m.hidden), i = static_cast<size_t>(m.intermediate);
  const auto v = static_cast<size_t>(m.vocab);
  out["model.embed_tokens.weight"] = v * h;
  out["model.norm.weight"] = h;
  out["lm_head.weight"] = v * h;
  for (int l = 0; l < m.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    for (const char* n : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"})
      out[p + n + ".weight"] = h * h;
    for (const char* n : {"mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"}) out[p + n + ".weight"] = h * i;
    out[p + "input_layernorm.weight"] = h;
    out[p + "post_attention_layernorm.weight"] = h;
  }
  return out;
}

// A finalized engine on one in-process rank's communicator, with the
// harness's host allocator and stream; base_config(stage) changed by `tweak`.
struct RankEngine {
  CachingAllocator alloc{make_host_allocator()};
  std::unique_ptr<Engine> engine;
  RankEngine(Communicator& comm, int stage, const std::function<void(Engine&)>& model,
             const std::function<void(EngineConfig&)>& tweak = {}) {
    EngineConfig config = base_config(stage);
    if (tweak) tweak(config);
    engine = std::make_unique<Engine>(config, comm, alloc, Stream::default_for(Device::host()));
    model(*engine);
    engine->finalize(init_values);
  }
  Engine& operator*() { return *engine; }
  Engine* operator->() { return engine.get(); }
};

inline std::string hf_tool(const std::string& args) {
  return fmt::format("python3 {}/tests/tools/hf_llama_writer.py {}", ZEST_SOURCE_DIR, args);
}

// Writes the checkpoint into `dir` (dtype bf16, fp16 or fp32; `extra`
// more arguments such as --nan NAME:INDEX).
inline void write_llama_checkpoint(const std::string& dir, const std::string& dtype, uint64_t max_shard_size,
                                   const std::string& extra = "") {
  const std::string cmd = hf_tool(fmt::format("write {} --dtype {} --max-shard-size {} {}", dir, dtype,
                                              max_shard_size, extra));
  if (std::system(cmd.c_str()) != 0) throw std::runtime_error("failed: " + cmd);
}

}  // namespace zest::test
