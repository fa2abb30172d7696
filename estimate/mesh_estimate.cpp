#include "zest/estimate/mesh_estimate.h"

#include <fmt/format.h>

#include <algorithm>

#include "zest/core/check.h"
#include "zest/core/units.h"
#include "zest/estimate/count_text.h"

namespace zest {

MeshEstimate estimate_mesh_memory(const TransformerShape& shape, const EstimateOptions& options) {
  options.validate();
  check_transformer_split(shape, options.tp_size, options.pp_size);
  MeshEstimate m;
  for (int p = 0; p < options.pp_size; ++p) {
    // The middle stages are alike: estimated once.
    const bool as_previous = p >= 2 && p < options.pp_size - 1;
    m.stage_models.push_back(as_previous ? m.stage_models.back()
                                         : transformer_stage_model(shape, options.tp_size, options.pp_size, p));
    m.stages.push_back(as_previous ? m.stages.back() : estimate_memory(m.stage_models.back(), options));
    if (m.stages.back().peak_bytes > m.busiest_estimate().peak_bytes) m.busiest = p;
  }
  return m;
}

namespace {

// "0", "1-14", "15": the stages a row stands for.
std::string stage_range(int first, int last) {
  return first == last ? fmt::format("{}", first) : fmt::format("{}-{}", first, last);
}

std::string stage_role(int first, int last, int pp) {
  if (pp == 1) return "embedding, layers, head";
  if (last == 0) return "embedding, layers";
  if (first == pp - 1) return "layers, head";
  return "layers";
}

}  // namespace

std::string format_mesh_table(const TransformerShape& shape, const EstimateOptions& options,
                              const TableOptions& table) {
  std::vector<int> zero_stages;  // those of table.stages the offload choice allows, as format_estimate_table
  std::vector<MeshEstimate> per_zero;
  for (int zs : table.stages) {
    EstimateOptions o = options;
    o.zero.stage = zs;
    if (table.stages.size() > 1 && !offload_allowed(o)) continue;
    zero_stages.push_back(zs);
    per_zero.push_back(estimate_mesh_memory(shape, o));
  }
  ZEST_CHECK(!per_zero.empty(), "no ZeRO stage of those asked for allows this offload choice (optimizer and bf16 "
                                "master weights: stages 1-3; parameters: stage 3)");
  const int pp = options.pp_size;
  const size_t layers_per_stage = shape.layers / static_cast<size_t>(pp);
  std::string out = fmt::format("transformer: {}: {} parameters\n", shape.summary(), with_commas(shape.numel()));
  out += fmt::format("mesh: dp {} x tp {} x pp {} = {} ranks, Megatron's split: {} layers a stage, attention, MLP "
                     "and word embeddings / tp, norms, row-parallel biases and position embeddings whole\n\n",
                     options.world_size, options.tp_size, pp, options.mesh_size(), layers_per_stage);
  out += fmt::format("{:<10}{:<26}{:>16}", "pp stage", "holds", "params/rank");
  for (int zs : zero_stages) out += fmt::format("{:>16}", fmt::format("ZeRO-{} states", zs));
  out += "\n";
  double largest = 0;
  for (const MeshEstimate& me : per_zero) {
    for (const MemoryEstimate& e : me.stages) largest = std::max(largest, static_cast<double>(e.model_state_bytes));
  }
  const SiUnit unit = unit_for(largest);
  // Rows: the first stage, the middle ones together, the last.
  std::vector<std::pair<int, int>> rows = {{0, 0}};
  if (pp > 2) rows.emplace_back(1, pp - 2);
  if (pp > 1) rows.emplace_back(pp - 1, pp - 1);
  for (const auto& [first, last] : rows) {
    const MeshEstimate& any = per_zero.front();
    out += fmt::format("{:<10}{:<26}{:>16}", stage_range(first, last), stage_role(first, last, pp),
                       with_commas(any.stage_models[static_cast<size_t>(first)].numel()));
    for (const MeshEstimate& m : per_zero) {
      const bool busiest = m.busiest >= first && m.busiest <= last;
      const auto bytes = static_cast<double>(m.stages[static_cast<size_t>(first)].model_state_bytes);
      out += fmt::format("{:>16}", fmt::format("{:.3f} {}{}", bytes / unit.scale, unit.name, busiest ? "*" : " "));
    }
    out += "\n";
  }
  out += "*: the busiest stage (the largest peak), what each rank must fit.\n";
  if (table.device_bytes) {
    // Whether the busiest rank fits, at its peak with the runtime reserve.
    // The largest model that fits a mesh is not searched: the table below
    // leaves out its rows, which scale one replica's units.
    const int64_t device = *table.device_bytes;
    out += fmt::format("{:<52}", fmt::format("fits {:.3g} GB = {}", static_cast<double>(device) / 1e9,
                                            format_bytes(device)));
    for (const MeshEstimate& m : per_zero) {
      const MemoryEstimate& e = m.busiest_estimate();
      out += fmt::format("{:>16}", e.peak_bytes + e.runtime_reserve_bytes <= device ? "yes" : "no");
    }
    out += fmt::format("   the busiest stage's peak + {} runtime reserve\n",
                       format_bytes(per_zero.front().busiest_estimate().runtime_reserve_bytes));
  }
  const MeshEstimate& last = per_zero.back();
  out += fmt::format("\npipeline stage {} ({}), a rank of it:\n", last.busiest,
                     stage_role(last.busiest, last.busiest, pp));
  TableOptions one_rank = table;
  one_rank.device_bytes.reset();
  out += format_estimate_table(last.stage_models[static_cast<size_t>(last.busiest)], options, one_rank);
  return out;
}

}  // namespace zest
