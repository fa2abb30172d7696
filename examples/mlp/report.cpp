#include "report.h"

#include <fmt/format.h>

#include "zest/engine/layout_constants.h"

namespace mlp {

std::vector<int64_t> gather_int64(zest::Communicator& comm, int64_t value) {
  std::vector<int64_t> all(static_cast<size_t>(comm.size()));
  const zest::Stream host = zest::Stream::default_for(zest::Device::host());
  comm.all_gather(std::span<const int64_t>(&value, 1), std::span<int64_t>(all), host);
  return all;
}

float mean_over_ranks(zest::Communicator& comm, float value) {
  float mean = 0.0f;
  const zest::Stream host = zest::Stream::default_for(zest::Device::host());
  comm.all_reduce(std::span<const float>(&value, 1), std::span<float>(&mean, 1), zest::ReduceOp::kAvg, host);
  return mean;
}

void print_step(long step, float loss, const zest::StepResult& r, double ms,
                const std::vector<int64_t>& model_state_bytes_per_rank) {
  std::string memory;
  for (int64_t b : model_state_bytes_per_rank) memory += fmt::format(" {:.2f}", static_cast<double>(b) / (1 << 20));
  fmt::print("step {:4d}  loss {:.5f}  |g| {:.4f}  lr {:.2e}{}{}  {:7.1f} ms  model states MiB/rank:{}\n",
             step, loss, r.grad_norm, r.lr, r.loss_scale != 1.0 ? fmt::format("  scale {:g}", r.loss_scale) : "",
             r.applied ? "" : "  (" + r.skip_reason + ")", ms, memory);
  std::fflush(stdout);
}

std::string format_stage_table(const std::vector<StageRow>& rows, long parameters,
                               const zest::EngineConfig& config) {
  using zest::MemoryCategory;
  const double psi = static_cast<double>(parameters);
  const double bc = config.fp16.enabled || config.bf16 ? 2.0 : 4.0;
  // K of the paper: the fp32 master copy (none when training in fp32, where
  // the parameters are the master) plus the optimizer's fp32 state.
  const double k = (bc == 2.0 ? 4.0 : 0.0) + 4.0 * config.optimizer.state_buffers();
  const auto kib = [](double bytes) { return fmt::format("{:.1f}", bytes / 1024.0); };

  std::string out = fmt::format(
      "Per-rank memory after training (KiB), measured through the allocator's categories, against the\n"
      "ZeRO formula for Ψ = {} parameters, {} bytes each, K = {}. The difference is the layout's padding:\n"
      "each layer is padded to a multiple of ranks x {} elements (stage 0: {}).\n\n",
      parameters, bc, k, zest::kShardQuantum, zest::kShardQuantum);
  out += fmt::format("{:>5} {:>5} {:>11} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>9}\n", "stage", "ranks",
                     "final loss", "params", "grads", "master", "optim", "measured", "formula", "padding");
  for (const StageRow& row : rows) {
    const double w = row.world;
    const double shard = row.stage == 0 ? 1.0 : w;
    const double formula = (row.stage < 3 ? bc * psi : bc * psi / w) + (row.stage < 2 ? bc * psi : bc * psi / w) +
                           k * psi / shard;
    const zest::MemoryReport& m = row.summary.memory;
    const double measured = static_cast<double>(m.model_states());
    out += fmt::format("{:>5} {:>5} {:>11.5f} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>8.2f}%\n", row.stage,
                       row.world, row.summary.final_loss, kib(m[MemoryCategory::kParameters].current),
                       kib(m[MemoryCategory::kGradients].current), kib(m[MemoryCategory::kMasterWeights].current),
                       kib(m[MemoryCategory::kOptimizerState].current), kib(measured), kib(formula),
                       100.0 * (measured - formula) / formula);
  }
  out += "\nformula: stage 0 (2+2+K)Ψ, 1 2Ψ+2Ψ+KΨ/N, 2 2Ψ+(2+K)Ψ/N, 3 (2+2+K)Ψ/N (2 = bytes of the compute dtype)\n";
  return out;
}

}  // namespace mlp
