// The cost model as text: a row per sharding mode, memory beside traffic
// and time, then the links the times assume.
#include <algorithm>

#include <fmt/format.h>

#include "zest/estimate/cost_model.h"

namespace zest {

namespace {

std::string_view group_name(CommGroup g) {
  switch (g) {
    case CommGroup::kWorld: return "world";
    case CommGroup::kShard: return "shard group";
    case CommGroup::kReplica: return "replica group";
    case CommGroup::kHpz: return "hpZ group";
  }
  return "?";
}

}  // namespace

std::string format_cost_table(const ModelDescription& model, const std::vector<ModeRow>& rows,
                              const Topology& topology, int gathers_per_micro_step, bool traffic) {
  std::vector<CostEstimate> costs;
  double largest = 0.0;
  for (const ModeRow& r : rows) {
    CostOptions o;
    o.estimate = r.options;
    o.topology = topology;
    o.gathers_per_micro_step = gathers_per_micro_step;
    costs.push_back(estimate_cost(model, o));
    const CostEstimate& c = costs.back();
    largest = std::max({largest, static_cast<double>(c.memory.peak_bytes), c.intra_bytes_per_rank,
                        c.inter_bytes_per_rank, c.host_link_bytes});
  }
  // One decimal unit for every column, so that rows compare at a glance.
  const double scale = largest >= 1e9 ? 1e9 : largest >= 1e6 ? 1e6 : 1e3;
  const char* unit = largest >= 1e9 ? "GB" : largest >= 1e6 ? "MB" : "kB";
  const auto cell = [&](double bytes) { return fmt::format("{:.3f}", bytes / scale); };

  std::string out = fmt::format(
      "{} hosts x {} ranks, {}; per optimizer step of {} micro-step(s), {} in {}\n", topology.hosts,
      topology.ranks_per_host,
      topology.algorithm == CollectiveAlgorithm::kRing ? "ring collectives (NCCL)" : "pairwise exchanges (ZEST's MPI)",
      rows.empty() ? 1 : rows.front().options.gradient_accumulation_steps, model.summary(),
      rows.empty() ? "fp16" : dtype_name(rows.front().options.compute_dtype));
  out += fmt::format("{:<18} {:>12} {:>12} {:>13} {:>13} {:>13} {:>12}\n", "mode", "states", "peak",
                     "within host", "across hosts", "host link", "comm s/step");
  out += fmt::format("{:<18} {:>12} {:>12} {:>13} {:>13} {:>13} {:>12}\n", "",
                     fmt::format("{}/rank", unit), fmt::format("{}/rank", unit), fmt::format("{}/rank", unit),
                     fmt::format("{}/rank", unit), fmt::format("{}/dir", unit), "(no overlap)");
  for (size_t i = 0; i < rows.size(); ++i) {
    const CostEstimate& c = costs[i];
    out += fmt::format("{:<18} {:>12} {:>12} {:>13} {:>13} {:>13} {:>12.4g}\n", rows[i].label,
                       cell(static_cast<double>(c.memory.model_state_bytes)),
                       cell(static_cast<double>(c.memory.peak_bytes)), cell(c.intra_bytes_per_rank),
                       cell(c.inter_bytes_per_rank), cell(c.host_link_bytes), c.seconds);
  }
  if (traffic) {
    out += "\nper collective kind (calls a step, the group, each rank's bytes, seconds):\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      out += fmt::format("{}\n", rows[i].label);
      for (const TrafficCost& t : costs[i].traffic) {
        out += fmt::format("  {:<28} {:>7} x {:<14} of {:>7} ranks, {:<12} {:>12} {}/rank {:>12.4g} s\n",
                           traffic_kind_name(t.traffic), t.calls, group_name(t.group), t.group_size,
                           t.link == LinkClass::kInter ? "across hosts" : "within host", cell(t.bytes_per_rank), unit,
                           t.seconds);
      }
    }
    out += "\n";
  }
  out += fmt::format(
      "links: within a host {:.4g} GB/s a rank, {:.3g} us; between hosts {:.4g} GB/s a host (its ranks share it), "
      "{:.3g} us\n",
      topology.intra.bytes_per_s / 1e9, topology.intra.latency_s * 1e6, topology.inter.bytes_per_s / 1e9,
      topology.inter.latency_s * 1e6);
  out += "within host / across hosts: each rank's bytes on collectives whose group lies in one host / spans hosts "
         "(the engine's comm counters); host link: one host's inter link, per direction; comm s: every "
         "collective one after another, alpha-beta (estimate/cost_model.h), none hidden behind compute\n";
  return out;
}

}  // namespace zest
