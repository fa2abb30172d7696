#include "report.h"

#include <array>
#include <bit>

#include <fmt/format.h>

#include "zest/engine/layout_constants.h"
#include "zest/estimate/memory_estimate.h"

namespace mlp {

std::vector<RankStep> gather_step(zest::Engine& engine, float loss) {
  const zest::MemoryReport m = engine.memory_report();
  // The loss travels as its float's bits, widened to an int64.
  const std::array<int64_t, 3> mine = {std::bit_cast<int32_t>(loss), m.model_states(),
                                       m[zest::MemoryCategory::kWorkspace].peak};
  const std::vector<int64_t> all = engine.all_gather_scalars(mine);
  std::vector<RankStep> ranks(all.size() / mine.size());
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int64_t* v = &all[r * mine.size()];
    ranks[r] = {std::bit_cast<float>(static_cast<int32_t>(v[0])), v[1], v[2]};
  }
  return ranks;
}

void print_step(long step, const std::vector<RankStep>& ranks, const zest::StepResult& r, double ms) {
  const auto mib = [](int64_t bytes) { return fmt::format(" {:.2f}", static_cast<double>(bytes) / (1 << 20)); };
  float loss = 0.0f;
  std::string model_states, workspace;
  bool any_workspace = false;
  for (const RankStep& rank : ranks) {
    loss += rank.loss / static_cast<float>(ranks.size());
    model_states += mib(rank.model_states);
    workspace += mib(rank.workspace_peak);
    any_workspace = any_workspace || rank.workspace_peak > 0;
  }
  fmt::print("step {:4d}  loss {:.5f}  |g| {:.4f}  lr {:.2e}{}{}  {:7.1f} ms  model states MiB/rank:{}{}\n",
             step, loss, r.grad_norm, r.lr, r.loss_scale != 1.0 ? fmt::format("  scale {:g}", r.loss_scale) : "",
             r.applied ? "" : "  (" + r.skip_reason + ")", ms, model_states,
             any_workspace ? "  workspace peak MiB/rank:" + workspace : "");
  std::fflush(stdout);
}

std::string format_stage_table(const std::vector<StageRow>& rows, long parameters,
                               const zest::EngineConfig& config) {
  using zest::MemoryCategory;
  const zest::DType dtype = config.compute_dtype();
  const double bc = static_cast<double>(zest::elem_size(dtype));
  const double k = zest::paper_k(dtype, config.optimizer, config.master_dtype(), config.optimizer_state_dtype());
  const auto kib = [](double bytes) { return fmt::format("{:.1f}", bytes / 1024.0); };

  std::string out = fmt::format(
      "Per-rank memory after training (KiB), measured through the allocator's categories, against the\n"
      "ZeRO formula for Ψ = {} parameters, {} bytes each, K = {}. The difference is the layout's padding:\n"
      "each layer is padded to a multiple of ranks x {} elements (stage 0: {}).\n\n",
      parameters, bc, k, zest::kShardQuantum, zest::kShardQuantum);
  out += fmt::format("{:>5} {:>5} {:>11} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>9}\n", "stage", "ranks",
                     "final loss", "params", "grads", "master", "optim", "measured", "formula", "padding");
  for (const StageRow& row : rows) {
    const double formula =
        zest::paper_model_bytes(static_cast<double>(parameters), row.sharded_over, row.stage, k, bc);
    const zest::MemoryReport& m = row.summary.memory;
    const double measured = static_cast<double>(m.model_states());
    out += fmt::format("{:>5} {:>5} {:>11.5f} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>8.2f}%\n", row.stage,
                       row.world, row.summary.final_loss, kib(m[MemoryCategory::kParameters].current),
                       kib(m[MemoryCategory::kGradients].current), kib(m[MemoryCategory::kMasterWeights].current),
                       kib(m[MemoryCategory::kOptimizerState].current), kib(measured), kib(formula),
                       100.0 * (measured - formula) / formula);
  }
  out += "\nformula: stage 0 (2+2+K)Ψ, 1 2Ψ+2Ψ+KΨ/N, 2 2Ψ+(2+K)Ψ/N, 3 (2+2+K)Ψ/N (2 = bytes of the compute dtype;\n"
         "N = the ranks, or at stage 3 with mics_shard_size the ranks of a group)\n";
  return out;
}

}  // namespace mlp
