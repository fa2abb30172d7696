// The command-line options that the libtorch language-model examples (gpt,
// llama) share: ranks, the training run, the corpus, evaluation, printing
// and ZEST checkpoints. Each example's Options derives from LmRunOptions
// and sets its own defaults where they differ.
#pragma once

#include <cstdint>
#include <string>

#include "cli/cli.h"
#include "zest/comm/communicator.h"
#include "zest/pipeline/schedule.h"

namespace examples {

struct LmRunOptions {
  int ranks = 2;        // in-process ranks (ignored with --launch)
  bool launch = false;  // one process per rank, from the launcher (mpirun)
  // --offload: the fp32 master weights and optimizer state in host memory,
  // stepped there (zero_optimization.offload_optimizer.device "cpu").
  bool offload = false;
  int64_t steps = 100;
  int64_t batch = 16;  // global rows (sequences of `context` bytes) per step
  float lr = 1e-3f;
  uint64_t seed = 1234;
  int threads = 1;  // torch intra-op threads per rank: see examples/gpt/main.cpp
  std::string data = "/usr/share/games/fortunes";
  int64_t eval_every = 50;
  int64_t val_windows = 256;  // of `context` bytes each; rounded down to a multiple of the ranks
  int64_t print_every = 10;
  std::string save_dir;  // a checkpoint after the last step
  std::string load_dir;  // resume from this checkpoint root first
  int save_total_limit = 0;  // --save-total-limit N: keep the last N checkpoints of --save (0: all)
  zest::CommOptions comm;  // --timeout SECONDS (else ZEST_COMM_TIMEOUT, else 10 min)
};

// --ranks, --launch, --offload, --steps, --batch, --lr, --seed, --threads,
// --data, --eval-every, --val-windows, --print-every, --save, --load,
// --save-total-limit and --timeout, each with its range.
inline void add_lm_run_flags(cli::App& app, LmRunOptions& o) {
  app.add_flag("--launch", o.launch);
  app.add_flag("--offload", o.offload);
  app.add_option("--ranks", o.ranks)->check(cli::Range(1, 1 << 16));
  app.add_option("--steps", o.steps)->check(cli::Range(int64_t{0}, int64_t{1} << 40));
  app.add_option("--batch", o.batch)->check(cli::Range(int64_t{1}, int64_t{1} << 20));
  app.add_option("--lr", o.lr)->check(cli::real_range(0, 10));
  app.add_option("--seed", o.seed);
  app.add_option("--threads", o.threads)->check(cli::Range(1, 1024));
  app.add_option("--data", o.data);
  app.add_option("--eval-every", o.eval_every)->check(cli::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--val-windows", o.val_windows)->check(cli::Range(int64_t{1}, int64_t{1} << 30));
  app.add_option("--print-every", o.print_every)->check(cli::Range(int64_t{1}, int64_t{1} << 40));
  app.add_option("--save", o.save_dir);
  app.add_option("--load", o.load_dir);
  app.add_option("--save-total-limit", o.save_total_limit)->check(cli::Range(1, 1 << 20));
  cli::add_timeout(app, o.comm);
}

// --tp, --pp, --pipeline-schedule: a device mesh of ranks / (tp x pp)
// data-parallel replicas in Megatron's order (tp fastest), each layer split
// over tp ranks and the blocks over pp stages, the batch's micro-batches
// (--accum) run through the stages in the schedule (common/mesh_trainer.h).
struct MeshFlags {
  int tp = 1;
  int pp = 1;
  zest::PipelineKind pipeline_schedule = zest::PipelineKind::k1F1B;

  bool mesh() const { return tp * pp > 1; }
  // ranks / (tp x pp); throws cli::UsageError when they do not divide.
  int data_parallel(int ranks) const {
    if (ranks % (tp * pp) != 0) {
      cli::usage_error("{} ranks do not divide into --tp {} x --pp {}: the data-parallel size is ranks / (tp x pp)",
                       ranks, tp, pp);
    }
    return ranks / (tp * pp);
  }
};

// --tp, --pp and --pipeline-schedule into `o`; finish_mesh_flags after
// parsing.
inline void add_mesh_flags(cli::App& app, MeshFlags& o, std::string& schedule) {
  app.add_option("--tp", o.tp)->check(cli::Range(1, 1 << 12));
  app.add_option("--pp", o.pp)->check(cli::Range(1, 1 << 12));
  app.add_option("--pipeline-schedule", schedule)->check(cli::IsMember({"1f1b", "gpipe"}));
}
inline void finish_mesh_flags(MeshFlags& o, const std::string& schedule) {
  if (schedule == "gpipe") o.pipeline_schedule = zest::PipelineKind::kGPipe;
}

}  // namespace examples
