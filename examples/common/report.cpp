#include "common/report.h"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace examples {
namespace {

using zest::MemoryCategory;

constexpr MemoryCategory kModelStates[] = {MemoryCategory::kParameters, MemoryCategory::kGradients,
                                           MemoryCategory::kMasterWeights, MemoryCategory::kOptimizerState};

std::string kib(int64_t bytes) { return fmt::format("{:.1f}", static_cast<double>(bytes) / 1024.0); }

bool rank_matches(const zest::MemoryReport& m, const zest::MemoryEstimate& e) {
  for (MemoryCategory c : kModelStates) {
    if (m[c].current != e[c].persistent) return false;
  }
  return true;
}

}  // namespace

std::vector<zest::MemoryReport> gather_memory(zest::Engine& engine) {
  const zest::MemoryReport m = engine.memory_report();
  std::vector<int64_t> mine;
  for (const auto& e : m.by_category) {
    mine.push_back(e.current);
    mine.push_back(e.peak);
  }
  mine.push_back(m.reserved);
  mine.push_back(m.allocated);
  mine.push_back(m.frozen_parameters);
  for (const auto& e : m.host_by_category) mine.push_back(e.current);
  mine.insert(mine.end(), {m.peak_reserved, m.peak_allocated, m.host_peak_reserved, m.process_rss, m.process_peak_rss,
                           m.engine_host_peak});
  const std::vector<int64_t> all = engine.all_gather_scalars(mine);
  std::vector<zest::MemoryReport> ranks(all.size() / mine.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int64_t* v = &all[r * mine.size()];
    for (size_t c = 0; c < zest::kNumMemoryCategories; ++c) ranks[r].by_category[c] = {v[2 * c], v[2 * c + 1]};
    ranks[r].reserved = v[2 * zest::kNumMemoryCategories];
    ranks[r].allocated = v[2 * zest::kNumMemoryCategories + 1];
    ranks[r].frozen_parameters = v[2 * zest::kNumMemoryCategories + 2];
    for (size_t c = 0; c < zest::kNumMemoryCategories; ++c) {
      ranks[r].host_by_category[c].current = v[2 * zest::kNumMemoryCategories + 3 + c];
    }
    const int64_t* peaks = v + 3 * zest::kNumMemoryCategories + 3;
    ranks[r].peak_reserved = peaks[0];
    ranks[r].peak_allocated = peaks[1];
    ranks[r].host_peak_reserved = peaks[2];
    ranks[r].process_rss = peaks[3];
    ranks[r].process_peak_rss = peaks[4];
    ranks[r].engine_host_peak = peaks[5];
  }
  return ranks;
}

void print_step(int64_t step, float mean_loss, const zest::StepResult& r, double ms, double tokens_per_s) {
  fmt::print("step {:5d}  loss {:.4f}  lr {:.2e}  |g| {:7.4f}{}{}  {:7.1f} ms  {:8.0f} tokens/s\n", step, mean_loss,
             r.lr, r.grad_norm, r.loss_scale != 1.0 ? fmt::format("  scale {:g}", r.loss_scale) : "",
             r.applied ? "" : "  (" + r.skip_reason + ")", ms, tokens_per_s);
  std::fflush(stdout);
}

bool memory_matches(const std::vector<zest::MemoryReport>& ranks, const zest::MemoryEstimate& estimate) {
  for (const zest::MemoryReport& m : ranks) {
    if (!rank_matches(m, estimate)) return false;
  }
  return true;
}

std::string format_memory(const std::vector<zest::MemoryReport>& ranks, const zest::MemoryEstimate& e) {
  std::string out = fmt::format("{:<10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11} {:>13}\n", "KiB", "params",
                                "grads", "master", "optim", "model states", "comm peak", "host offload");
  for (size_t r = 0; r < ranks.size(); ++r) {
    const zest::MemoryReport& m = ranks[r];
    out += fmt::format("{:<10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11} {:>13}  {}\n", fmt::format("rank {}", r),
                       kib(m[MemoryCategory::kParameters].current), kib(m[MemoryCategory::kGradients].current),
                       kib(m[MemoryCategory::kMasterWeights].current),
                       kib(m[MemoryCategory::kOptimizerState].current), kib(m.model_states()),
                       kib(m[MemoryCategory::kCommBuffers].peak), kib(m.host_model_states()),
                       rank_matches(m, e) ? "= estimate" : "differs");
  }
  out += fmt::format("{:<10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11}\n", "estimate",
                     kib(e[MemoryCategory::kParameters].persistent), kib(e[MemoryCategory::kGradients].persistent),
                     kib(e[MemoryCategory::kMasterWeights].persistent),
                     kib(e[MemoryCategory::kOptimizerState].persistent), kib(e.model_state_bytes),
                     kib(e[MemoryCategory::kCommBuffers].peak));
  return out;
}

std::string format_process_memory(const std::vector<zest::MemoryReport>& ranks, bool ranks_share_process) {
  const auto mib = [](int64_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0); };
  const char* rest = "libtorch's activations and allocator, the runtime's code, libraries and threads, the data";
  std::string out;
  const auto line = [&](const std::string& who, const zest::MemoryReport& m, int64_t engines, size_t count) {
    if (m.process_peak_rss < 0) {
      out += fmt::format("{}peak RSS unknown on this system; the engine's allocators peaked at {}\n", who, mib(engines));
      return;
    }
    out += fmt::format("{}peak RSS {}: the engine's allocators {} at their peak ({} rank{}), not accounted {} ({})\n",
                       who, mib(m.process_peak_rss), mib(engines), count, count == 1 ? "" : "s",
                       mib(m.process_peak_rss - engines), rest);
  };
  if (ranks_share_process) {
    int64_t engines = 0;
    for (const zest::MemoryReport& m : ranks) engines += m.engine_host_peak;
    line("process: ", ranks.at(0), engines, ranks.size());
  } else {
    for (size_t r = 0; r < ranks.size(); ++r) line(fmt::format("rank {} process: ", r), ranks[r], ranks[r].engine_host_peak, 1);
  }
  return out;
}

std::string format_host_tensor_cache(const zest::HugePageCache::Stats& cache, const std::string& who) {
  if (cache.hits + cache.misses == 0) return {};
  const auto mib = [](size_t bytes) { return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / 1048576.0); };
  return fmt::format("{}: of what is not accounted, libtorch's host tensors of 2 MiB and more took {} at their peak, "
                     "in huge pages ({} held now; {} of {} allocations reused a block, {} blocks given back)\n",
                     who, mib(cache.peak_in_use_bytes), mib(cache.in_use_bytes + cache.idle_bytes), cache.hits,
                     cache.hits + cache.misses, cache.evictions);
}

std::string format_parameter_split(const std::vector<zest::MemoryReport>& ranks, const zest::MemoryEstimate& e) {
  std::string out = fmt::format("{:<10} {:>12} {:>12}\n", "KiB", "frozen", "trainable");
  const auto row = [&](const std::string& who, int64_t params, int64_t frozen) {
    out += fmt::format("{:<10} {:>12} {:>12}\n", who, kib(frozen), kib(params - frozen));
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    row(fmt::format("rank {}", r), ranks[r][MemoryCategory::kParameters].current, ranks[r].frozen_parameters);
  }
  row("estimate", e[MemoryCategory::kParameters].persistent, e.frozen_parameter_bytes);
  return out;
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2.0;
}

void StepTimings::add(double step_ms, const zest::StepTimes& phases) {
  step_.push_back(step_ms);
  reduce_.push_back(phases.reduce_ms);
  norm_.push_back(phases.norm_ms);
  optimizer_.push_back(phases.optimizer_ms);
  gather_.push_back(phases.gather_ms);
}

std::string StepTimings::format() const {
  const auto n = static_cast<int64_t>(step_.size());
  const int64_t skip = n > untimed_ ? untimed_ : 0;
  const auto timed = [&](const std::vector<double>& v) {
    return median(std::vector<double>(v.begin() + skip, v.end()));
  };
  return fmt::format("step_ms_median={:.3f} timed_steps={} reduce_ms={:.3f} norm_ms={:.3f} optimizer_ms={:.3f} "
                     "gather_ms={:.3f}",
                     timed(step_), n - skip, timed(reduce_), timed(norm_), timed(optimizer_), timed(gather_));
}

std::string format_stage_table(const std::vector<StageRow>& rows) {
  std::string out = fmt::format("{:>5} {:>5} {:>20} {:>10} {:>20} {:>20}\n", "stage", "ranks", "validation loss",
                                "tokens/s", "model states KiB/rank", "estimate KiB/rank");
  for (const StageRow& r : rows) {
    out += fmt::format("{:>5} {:>5} {:>20.17g} {:>10.0f} {:>20} {:>20}{}\n", r.stage, r.world, r.val_loss,
                       r.tokens_per_s, kib(r.model_states), kib(r.estimate), r.matches ? "" : "  (differs)");
  }
  return out;
}

}  // namespace examples
