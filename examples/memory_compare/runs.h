// One comparison run: the example MLP trained for a few steps on `world`
// in-process ranks at one ZeRO stage, each rank with its own host caching
// allocator, and every rank's memory by category (Engine::memory_report())
// set beside zest::estimate_memory for the same configuration and model.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "options.h"
#include "zest/engine/engine.h"
#include "zest/estimate/memory_estimate.h"

namespace memory_compare {

// The categories the engine keeps for the whole run; the ZeRO paper's
// "model states". The estimate and the measurement must agree on these
// exactly.
inline constexpr std::array<zest::MemoryCategory, 4> kModelStates = {
    zest::MemoryCategory::kParameters, zest::MemoryCategory::kGradients,
    zest::MemoryCategory::kMasterWeights, zest::MemoryCategory::kOptimizerState};

// One rank's bytes (requested sizes, as the allocator's categories count
// them). The allocator's peaks are reset right after finalize(), so the run
// is seen in two phases: set-up (construction and finalize(), whose fp32
// staging of one unit is the comm_buffers peak) and training (the steps).
struct RankMemory {
  zest::MemoryReport after_finalize;  // current and peak through finalize()
  zest::MemoryReport at_end;          // current: after the last step; peak: training only
  int64_t setup_peak_total = 0;       // all categories at once, through finalize()
  int64_t training_peak_total = 0;    // all categories at once, during the steps

  int64_t current(zest::MemoryCategory c) const { return at_end[c].current; }
  // Highest bytes of the category over the whole run (what the estimate's
  // per-category peak models).
  int64_t run_peak(zest::MemoryCategory c) const;
  int64_t model_states() const { return at_end.model_states(); }

  // "" when equal, else the first quantities that differ.
  std::string difference(const RankMemory& other) const;
};

struct Comparison {
  int stage = 0;
  int world = 1;
  RankMemory measured;             // rank 0's
  zest::MemoryEstimate estimate;   // estimate_memory(model, EstimateOptions::from_config(config, world))
  zest::ModelDescription model;    // built from the engine's layout
  // "rank 2: ..." for each rank whose bytes differ from rank 0's; the layout
  // is the same on every rank, so this stays empty.
  std::vector<std::string> rank_differences;

  // Model-state categories whose end-of-run bytes differ from the
  // estimate's persistent bytes, as messages naming both.
  std::vector<std::string> mismatches() const;
};

// Trains opt.steps steps of the MLP at `stage` on `world` ranks and
// measures. Throws if a rank fails.
Comparison run_comparison(const Options& opt, int stage, int world);

}  // namespace memory_compare
