// Command-line options of the gpt example, and the engine configuration
// they make.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/cli.h"
#include "model.h"
#include "sample.h"
#include "zest/config/config.h"

namespace gpt {

using UsageError = cli::UsageError;

struct Options {
  Config model;
  int ranks = 4;  // in-process ranks (ignored with --launch)
  std::vector<int> stages{2};
  bool launch = false;  // one process per rank, from the launcher (mpirun)
  std::string dtype;    // empty: fp32, or what the config file says
  // --offload: the fp32 master weights and optimizer state in host memory,
  // stepped there (zero_optimization.offload_optimizer.device "cpu").
  bool offload = false;
  // --offload-param (stage 3): the parameter shards in host memory as well,
  // with the optimizer (offload_param and offload_optimizer "cpu").
  bool offload_param = false;
  std::string config_path;
  int64_t steps = 200;
  int64_t batch = 16;  // global rows (sequences of `context` bytes) per step
  int accum = 0;       // 0: 1, or what the config file says
  float lr = 3e-3f;
  int64_t warmup = 20;  // warmup steps of the cosine schedule
  int64_t schedule_steps = 0;  // the schedule's length; 0: --steps (set it when a run resumes)
  uint64_t seed = 1234;
  int threads = 1;  // torch intra-op threads per rank: see main.cpp
  std::string data = "/usr/share/games/fortunes";
  zest::CommOptions comm;  // --timeout SECONDS (else ZEST_COMM_TIMEOUT, else 10 min)
  int64_t eval_every = 50;
  int64_t val_windows = 256;  // of `context` bytes each; rounded down to a multiple of the ranks
  int64_t print_every = 10;
  std::string save_dir;  // a checkpoint after the last step
  std::string load_dir;  // resume from this checkpoint root first
  std::string export_path;  // safetensors, under the module's parameter names
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
