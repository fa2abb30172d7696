// Command-line options of the llama example, and the engine configuration
// they make.
#pragma once

#include <cstdint>
#include <string>

#include "common/cli.h"
#include "common/lm_options.h"
#include "config.h"
#include "zest/config/config.h"

namespace llama {

using UsageError = cli::UsageError;

// The shared flags (ranks, run, corpus, ZEST checkpoints) are
// examples::LmRunOptions'; --steps 0 loads, reports and exports without
// training.
struct Options : examples::LmRunOptions {
  Options() {
    batch = 8;
    val_windows = 64;
  }
  Config model;             // --config's, or the example's small sizes
  std::string config_path;  // a config.json (LlamaConfig's keys)
  int stage = 3;
  std::string dtype = "fp32";  // fp32 or bf16
  int64_t context = 64;
  int64_t lora_r = 0;       // 0: full fine-tuning
  double lora_alpha = 8.0;  // PEFT's default
  // Hugging Face checkpoints: the directory to load (config.json and
  // *.safetensors) and the one to write, in shards of at most
  // max_shard_size bytes; activation checkpointing per decoder layer.
  std::string hf_dir;
  std::string export_hf_dir;
  int64_t max_shard_size = int64_t{5} * 1000 * 1000 * 1000;  // HF's "5GB"
  bool recompute = false;
};

std::string usage();
// Throws UsageError naming the bad argument (or a config.json that cannot
// be used).
Options parse_options(int argc, char** argv);

// "5GB", "500MB", "2GiB", "123456": bytes, as transformers' max_shard_size
// reads them (KB, MB, GB decimal; KiB, MiB, GiB binary). Throws UsageError.
int64_t parse_byte_size(const std::string& text);

// AdamW at --lr (examples::default_engine_config), --stage, --dtype,
// --offload. Throws UsageError when --batch does not divide into the ranks.
zest::EngineConfig engine_config(const Options& opt, int world);

}  // namespace llama
