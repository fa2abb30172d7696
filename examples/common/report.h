// What the libtorch examples (gpt, llama) print: a line per step, the memory of every rank by
// category against the memory estimator, and the table comparing stages.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zest/engine/engine.h"
#include "zest/estimate/memory_estimate.h"
#include "zest/memory/huge_page_cache.h"

namespace examples {

// Every rank's memory report, rank by rank, on every rank. Collective.
std::vector<zest::MemoryReport> gather_memory(zest::Engine& engine);

// step, mean loss over ranks, lr, gradient norm, time and tokens per second
// (of the global batch).
void print_step(int64_t step, float mean_loss, const zest::StepResult& r, double ms, double tokens_per_s);

// A row per rank of the engine's memory by category (KiB: the model states
// now, the communication buffers at their peak), then the estimator's
// figures for one rank; "= estimate" when a rank's model states match the
// estimate to the byte in every category.
std::string format_memory(const std::vector<zest::MemoryReport>& ranks, const zest::MemoryEstimate& estimate);
// The process's peak resident memory against what the engines' allocators
// took of it (Note [what a process's peak RSS holds], engine.h), the rest
// named: one line for in-process ranks (`ranks_share_process`, every rank's
// engine subtracted), else one per rank's process.
std::string format_process_memory(const std::vector<zest::MemoryReport>& ranks, bool ranks_share_process);
// What libtorch's large host tensors took of `who`'s unaccounted memory
// (zest::use_huge_page_host_tensors()): the huge page cache's peak in use,
// what it holds now, and its reuse; empty when the cache served nothing.
std::string format_host_tensor_cache(const zest::HugePageCache::Stats& cache, const std::string& who);
// A row per rank of the parameters' device bytes split into frozen (no
// gradient, master or optimizer state: a LoRA base) and trainable, then the
// estimator's split (KiB).
std::string format_parameter_split(const std::vector<zest::MemoryReport>& ranks, const zest::MemoryEstimate& estimate);
// True when every rank's model-state categories equal the estimate's
// persistent bytes.
bool memory_matches(const std::vector<zest::MemoryReport>& ranks, const zest::MemoryEstimate& estimate);

struct StageRow {
  int stage = 0;
  int world = 1;
  double val_loss = 0.0;     // at the end
  double tokens_per_s = 0.0;  // mean over the run's steps
  int64_t model_states = 0;  // rank 0's bytes
  int64_t estimate = 0;      // the estimator's, per rank
  bool matches = false;      // every rank, every category
};

// The median of `values` (the mean of the middle two for an even count,
// as Python's statistics.median); 0 for none.
double median(std::vector<double> values);

// A run's step times for scripts (bench/peer_compare.py): the median of the
// whole step's milliseconds and of the engine's phases in it (StepTimes:
// gradient reductions, norm, optimizer, gathers), leaving out the first
// `untimed` steps when there are more.
class StepTimings {
 public:
  explicit StepTimings(int64_t untimed) : untimed_(untimed) {}
  void add(double step_ms, const zest::StepTimes& phases);
  // "step_ms_median=12.345 timed_steps=17 reduce_ms=1.200 norm_ms=0.010
  // optimizer_ms=2.300 gather_ms=0.800"
  std::string format() const;

 private:
  int64_t untimed_;
  std::vector<double> step_, reduce_, norm_, optimizer_, gather_;
};

// A row per stage; the validation losses with all their digits, so that
// equal ones are seen to be equal.
std::string format_stage_table(const std::vector<StageRow>& rows);

}  // namespace examples
