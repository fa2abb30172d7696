// What the mlp example prints: a line per step, and the table comparing
// stages (final loss, and measured memory by category against the ZeRO
// paper's formula).
#pragma once

#include <string>
#include <vector>

#include "zest/engine/engine.h"

namespace mlp {

struct RunSummary {
  float final_loss = 0.0f;      // on a held-out batch
  zest::MemoryReport memory;    // rank 0's, at the end
};

struct StageRow {
  int stage = 0;
  int world = 1;
  RunSummary summary;
  int sharded_over = 1;  // the ranks the model states are sharded over: world, or MiCS's group
};

// What a step line shows of one rank.
struct RankStep {
  float loss = 0.0f;           // mean over the rank's micro-batches
  int64_t model_states = 0;    // bytes now: parameters, gradients, master weights, optimizer state
  int64_t workspace_peak = 0;  // bytes at the peak: the loop's scratch (the device path's; 0 on the host)
};

// Every rank's, rank by rank, on every rank: over the engine's control
// communicator, which goes through the engine's memory, so it works on NCCL
// (device buffers only) as on the host. Collective.
std::vector<RankStep> gather_step(zest::Engine& engine, float loss);

// The mean loss over ranks, and each rank's memory.
void print_step(long step, const std::vector<RankStep>& ranks, const zest::StepResult& result, double ms);

std::string format_stage_table(const std::vector<StageRow>& rows, long parameters,
                               const zest::EngineConfig& config);

}  // namespace mlp
