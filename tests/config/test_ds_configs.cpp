// Real DeepSpeed config files, unchanged (tests/config/ds_configs, sources
// in SOURCES.md): each either loads, its "auto" filled from one fixed
// AutoValues, or is refused with messages naming the features ZEST lacks,
// never an unknown key.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>

#include "config/config_test_helpers.h"
#include "zest/config/config.h"
#include "zest/core/check.h"

using namespace zest;
using namespace zest::test;
namespace fs = std::filesystem;

namespace {

const fs::path kDir = ds_config_path("");

// File -> what its error must say (each substring); absent: it loads.
const std::map<std::string, std::vector<std::string>> kRefused = {
    {"deepspeed__tests_model_BingBertSquad_deepspeed_bsz24_fp16_eigenvalue_quantize_config.json",
     {"eigenvalue computation (for MoQ)", "quantization-aware training (MoQ)"}},
    {"dsexamples__compression_gpt2_config_ds_config_W8A8_Qgroup64_fp16.json",
     {"compression training"}},
    {"dsexamples__training_bing_bert_1-bit_adam_nccl_deepspeed_bsz4k_onebitadam_config_seq128_nccl.json",
     {"1-bit Adam"}},
    {"dsexamples__training_bing_bert_deepspeed_bsz4k_progressive_layer_drop_config_seq128.json",
     {"progressive layer drop"}},
    {"dsexamples__training_bing_bert_deepspeed_bsz64k_lamb_config_seq128.json",
     {"DeepSpeed's sparse attention"}},
    {"dsexamples__training_data_efficiency_vit_finetuning_config_ds_config_cifar_random_ltd.json",
     {"DeepSpeed's data efficiency library"}},
    // DeepSpeed's own optimizer builder refuses this parameter by name.
    {"megatronds__examples_deepspeed_curriculum_learning_ds_zero_stage_1_config_baseline.json",
     {"DeepSpeed refuses max_grad_norm as an optimizer parameter; write it as the top-level gradient_clipping"}},
};

std::vector<fs::path> config_files() {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(kDir))
    if (e.path().extension() == ".json") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace

TEST_CASE("every real DeepSpeed file loads unchanged, or is refused naming the feature ZEST lacks") {
  const std::vector<fs::path> files = config_files();
  REQUIRE(files.size() == 51);
  int loaded = 0, refused = 0;
  for (const fs::path& f : files) {
    const std::string name = f.filename().string();
    CAPTURE(name);
    const auto want = kRefused.find(name);
    std::string error;
    try {
      const EngineConfig c = load_config_file(f.string(), ds_config_program());
      // The batch arithmetic the Engine does next holds on one rank.
      EngineConfig batch = c;
      if (c.train_batch_size || c.train_micro_batch_size_per_gpu) batch.resolve_batch(1);
    } catch (const Error& e) {
      error = e.message();
    }
    if (want == kRefused.end()) {
      CHECK(error == "");
      ++loaded;
      continue;
    }
    ++refused;
    REQUIRE(!error.empty());
    for (const std::string& feature : want->second) CHECK(error.find(feature) != std::string::npos);
    CHECK(error.find("unknown") == std::string::npos);
  }
  CHECK(loaded == 44);
  CHECK(refused == 7);
  CHECK(kRefused.size() == 7);
}

TEST_CASE("real files load with the values they say") {
  const auto load = [](const char* name) { return load_config_file((kDir / name).string(), ds_config_program()); };
  // LLaVA's ZeRO-3 file: Hugging Face's hidden-size rules at hidden 1024.
  const EngineConfig llava = load("llava__scripts_zero3.json");
  CHECK(llava.zero.stage == 3);
  CHECK(llava.zero.reduce_bucket_size == 1048576);
  CHECK(llava.zero.stage3_prefetch_bucket_size == 943718);
  CHECK(llava.zero.stage3_param_persistence_threshold == 10240);
  CHECK(llava.zero.stage3_max_live_parameters == 1'000'000'000);
  CHECK(llava.bf16);
  CHECK_FALSE(llava.fp16.enabled);
  CHECK(llava.train_micro_batch_size_per_gpu == 4);
  CHECK(llava.gradient_accumulation_steps == 2);
  CHECK_FALSE(llava.train_batch_size.has_value());  // no world size given: the Engine derives it
  std::vector<std::string> ignored;
  for (const ConfigNote& n : llava.ignored) ignored.push_back(n.key);
  CHECK(ignored == std::vector<std::string>{"zero_optimization.stage3_gather_16bit_weights_on_model_save",
                                            "zero_optimization.sub_group_size"});
  CHECK(llava.zero.stage3_max_reuse_distance == 1'000'000'000);

  // LLaMA-Factory's AutoTP file: the tensor-parallel size, for the
  // estimator; the Engine is told it splits nothing from a file.
  const EngineConfig autotp = load("llamafactory__examples_deepspeed_ds_z2_autotp_config.json");
  CHECK(autotp.tensor_parallel_size == 2);
  CHECK(autotp.pipeline_stages == 1);
  const auto note = std::find_if(autotp.ignored.begin(), autotp.ignored.end(),
                                 [](const ConfigNote& n) { return n.key == "tensor_parallel.autotp_size"; });
  REQUIRE(note != autotp.ignored.end());
  CHECK(note->text.starts_with("ZEST splits no model from a file: build a DeviceMesh"));

  // axolotl's ZeRO-3 file uses the short stage-3 names.
  const EngineConfig axo = load("axolotl__deepspeed_configs_zero3.json");
  CHECK(axo.zero.stage3_max_live_parameters == 0);
  CHECK(axo.zero.stage3_max_reuse_distance == 0);
  CHECK(axo.fp16.initial_scale_power == 32);

  // DeepSpeed's BingBertSquad test: 24 / 3 / -, so 8 micro-steps per
  // optimizer step on one rank; its Adam without bias correction is AdamW.
  EngineConfig bert = load("deepspeed__tests_model_BingBertSquad_deepspeed_bsz24_fp16_config.json");
  CHECK(bert.fp16.enabled);
  CHECK(bert.optimizer.kind == OptimizerKind::kAdamW);
  CHECK_FALSE(bert.optimizer.bias_correction);
  bert.resolve_batch(1);
  CHECK(bert.gradient_accumulation_steps == 8);

  // ZeRO-Offload, as the files ask: Hugging Face's ZeRO-3 test file offloads
  // both, pinned; DeepSpeed's Megatron test uses the deprecated cpu_offload
  // (unpinned, the section's default); the hybrid engine's stage-0 file asks
  // for parameter offload, which DeepSpeed does only at stage 3.
  const EngineConfig hf3 = load("transformers__tests_deepspeed_ds_config_zero3.json");
  CHECK(hf3.zero.stage == 3);
  CHECK(hf3.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK(hf3.offload_optimizer.pin_memory);
  CHECK(hf3.offload_optimizer.ratio == 1.0);
  CHECK(hf3.offload_param.device == OffloadDevice::kCpu);
  CHECK(hf3.offload_param.pin_memory);
  CHECK(hf3.offload_param.buffer_count == 5);
  const EngineConfig fp8 = load("llamafactory__examples_deepspeed_ds_z3_fp8_config.json");
  CHECK(fp8.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK_FALSE(fp8.offload_optimizer.pin_memory);
  CHECK(fp8.offload_param.device == OffloadDevice::kNone);
  const EngineConfig axo2 = load("axolotl__deepspeed_configs_zero2.json");
  CHECK(axo2.zero.stage == 2);
  CHECK(axo2.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK_FALSE(axo2.offload_optimizer.pin_memory);
  const EngineConfig gpt2 = load("deepspeed__tests_model_Megatron_GPT2_ds_config_func_bs4_zero2_offload.json");
  CHECK(gpt2.zero.stage == 2);
  CHECK(gpt2.offload_optimizer.device == OffloadDevice::kCpu);
  CHECK_FALSE(gpt2.offload_optimizer.pin_memory);
  const EngineConfig hybrid = load("deepspeed__tests_hybrid_engine_hybrid_engine_config.json");
  CHECK(hybrid.zero.stage == 0);
  CHECK(hybrid.offload_param.device == OffloadDevice::kNone);

  // torch_compile's bf16 file carries fp16's loss-scale keys inside bf16.
  const EngineConfig tc = load("deepspeed__tests_torch_compile_ds_config_z3.json");
  CHECK(tc.bf16);
  CHECK(tc.zero.stage == 3);
  CHECK_FALSE(tc.zero.overlap());
  CHECK(tc.scheduler.kind == LrScheduleKind::kWarmupLR);
  CHECK(tc.optimizer.beta1 == 0.8f);
}
