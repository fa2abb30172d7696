// Command-line options of the gpt example, and the engine configuration
// they make.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "common/lm_options.h"
#include "common/lm_pretrained.h"
#include "model.h"
#include "sample.h"
#include "zest/config/config.h"
#include "zest/core/device.h"

namespace gpt {

using UsageError = cli::UsageError;

// The shared flags (ranks, run, corpus, checkpoints) are examples::LmRunOptions';
// --lora, --hf and --export-hf examples::PretrainedOptions'; --tp, --pp and
// --pipeline-schedule examples::MeshFlags' (the batch's --accum micro-batches
// run through the pipeline's stages).
struct Options : examples::LmRunOptions, examples::PretrainedOptions, examples::MeshFlags {
  Options() {
    ranks = 4;
    steps = 200;
    lr = 3e-3f;
  }
  Config model;  // --hf: its config.json's sizes
  std::string pretrained_dtype = "bfloat16";  // --hf: its config.json's torch_dtype, what --export-hf writes
  std::vector<int> stages{2};
  std::string dtype;  // empty: fp32, or what the config file says
  // --offload-param (stage 3): the parameter shards in host memory as well,
  // with the optimizer (offload_param and offload_optimizer "cpu").
  bool offload_param = false;
  std::string config_path;
  int accum = 0;  // 0: 1, or what the config file says
  int64_t warmup = 20;  // warmup steps of the cosine schedule
  int64_t schedule_steps = 0;  // the schedule's length; 0: --steps (set it when a run resumes)
  std::string export_path;  // safetensors, under the module's parameter names
  bool digest = false;  // print a digest of the trained weights per stage
  // --device cuda[:N]: the engine, the model and its inputs on the GPU (one
  // in-process rank unless --ranks says more, which TorchModule refuses:
  // in-process ranks cannot share a GPU through libtorch; under a launcher
  // each rank on cuda:(local rank), over NCCL).
  zest::Device device = zest::Device::host();
  SampleOptions sample;
  std::string prompt;
};

std::string usage();
// Throws UsageError naming the bad argument.
Options parse_options(int argc, char** argv);

// The configuration of one run: the file's (or the example's: AdamW with
// betas 0.9 and 0.95, weight decay 0.1 but none for biases and LayerNorms,
// gradient clipping at 1, linear warmup then cosine decay to a tenth over
// --schedule-steps), with --stage, --dtype and --accum on top.
zest::EngineConfig engine_config(const Options& opt, int stage, int world);

}  // namespace gpt
