// Command-line options of the llama example, and the engine configuration
// they make.
#pragma once

#include <cstdint>
#include <string>

#include "cli/cli.h"
#include "common/lm_options.h"
#include "common/lm_pretrained.h"
#include "common/token_data.h"
#include "config.h"
#include "zest/config/config.h"

namespace llama {

using UsageError = cli::UsageError;

// The shared flags (ranks, run, corpus, ZEST checkpoints) are
// examples::LmRunOptions'; --steps 0 loads, reports and exports without
// training. --tp, --pp and --pipeline-schedule (examples::MeshFlags) train
// over a device mesh, the batch's --accum micro-batches through the stages.
// --format megatron|jsonl|text with --data trains on a tokenized dataset or
// on text JSONL tokenized with the checkpoint's tokenizer.model
// (examples::TokenDataFlags: --tokenizer, --val-data, --max-seq-len, --packing,
// --epochs), rows of --max-seq-len tokens (which sets --context); without,
// the byte-level fortune corpus.
struct Options : examples::LmRunOptions, examples::PretrainedOptions, examples::MeshFlags, examples::TokenDataFlags {
  Options() {
    batch = 8;
    val_windows = 64;
  }
  Config model;             // --config's, or the example's small sizes
  std::string config_path;  // a config.json (LlamaConfig's keys)
  int stage = 3;
  std::string dtype = "fp32";  // fp32 or bf16
  int64_t context = 64;
  int accum = 1;  // micro-batches a step (gradient_accumulation_steps)
  bool recompute = false;
  int64_t save_every = 0;  // --save-every N: a checkpoint to --save every N steps as well
  int64_t loss_chunk = 0;  // --loss-chunk N: the head and loss N tokens at a time (model.h)
  int64_t attention_tile = 0;  // --attention-tile N: attention in tiles of N queries and keys
  int64_t mlp_tile = 0;        // --mlp-tile N: the MLP N tokens at a time, recomputed in backward
  // --warmup N and --lr-decay none|linear|cosine: Hugging Face's (and
  // torchtune's) schedules over the run's steps: linear warmup from 0, then
  // constant, linear or cosine decay to 0 (get_*_schedule_with_warmup).
  int64_t warmup = 0;
  std::string lr_decay = "none";
};

std::string usage();
// Throws UsageError naming the bad argument (or a config.json that cannot
// be used).
Options parse_options(int argc, char** argv);


// AdamW at --lr (examples::default_engine_config), --stage, --dtype,
// --offload, --accum. `world` is the data-parallel size. Throws UsageError
// when --batch does not divide into its ranks' micro-batches.
zest::EngineConfig engine_config(const Options& opt, int world);

}  // namespace llama
