// What the mlp example prints: a line per step, and the table comparing
// stages (final loss, and measured memory by category against the ZeRO
// paper's formula).
#pragma once

#include <string>
#include <vector>

#include "zest/comm/communicator.h"
#include "zest/engine/engine.h"

namespace mlp {

struct RunSummary {
  float final_loss = 0.0f;      // on a held-out batch
  zest::MemoryReport memory;    // rank 0's, at the end
  int64_t padded_params = 0;    // parameters with the layout's padding
};

struct StageRow {
  int stage = 0;
  int world = 1;
  RunSummary summary;
};

// Every rank's value, on every rank.
std::vector<int64_t> gather_int64(zest::Communicator& comm, int64_t value);
float mean_over_ranks(zest::Communicator& comm, float value);

void print_step(long step, float loss, const zest::StepResult& result, double ms,
                const std::vector<int64_t>& model_state_bytes_per_rank);

std::string format_stage_table(const std::vector<StageRow>& rows, long parameters,
                               const zest::EngineConfig& config);

}  // namespace mlp
