// Per-rank memory of a transformer on a dp x tp x pp device mesh: each
// pipeline stage's rank holds its share of the model as Megatron splits it
// (transformer_model.h), and ZeRO shards that share over the dp ranks with
// the accounting of estimate_memory, stage by stage. A run must fit the
// busiest stage.
//
//   // zest-example: run
//   zest::TransformerShape gpt{.layers = 96, .hidden = 12288, .heads = 96, .vocab = 51200, .positions = 2048};
//   zest::EstimateOptions opt;
//   opt.world_size = 12;  // data-parallel ranks
//   opt.tp_size = 8;
//   opt.pp_size = 16;     // 1536 ranks
//   opt.zero.stage = 0;
//   zest::MeshEstimate e = zest::estimate_mesh_memory(gpt, opt);
//   // The first stage holds the embeddings: 1,463,270,400 parameters of 16 bytes.
//   ZEST_CHECK(e.busiest == 0 && e.busiest_estimate().model_state_bytes == 23'412'326'400, "per rank");
#pragma once

#include <string>
#include <vector>

#include "zest/estimate/memory_estimate.h"
#include "zest/estimate/transformer_model.h"

namespace zest {

struct MeshEstimate {
  // Per pipeline stage (0 to pp - 1): the units of one of its ranks and
  // their estimate over options.world_size data-parallel ranks.
  std::vector<ModelDescription> stage_models;
  std::vector<MemoryEstimate> stages;
  // The stage whose rank needs the most device memory: the largest
  // peak_bytes, the first of equals (what a device must fit; the runtime
  // reserve is the same on every stage).
  int busiest = 0;

  const MemoryEstimate& busiest_estimate() const { return stages[static_cast<size_t>(busiest)]; }
};

// `shape` on options.world_size (dp) x options.tp_size x options.pp_size
// ranks, every stage under options (its ZeRO stage, dtypes, offload...).
// Throws what check_transformer_split and EstimateOptions::validate throw.
MeshEstimate estimate_mesh_memory(const TransformerShape& shape, const EstimateOptions& options);

// The stages side by side for each ZeRO stage of `table.stages`: parameters
// and model-state bytes of a rank of each pipeline stage (the middle ones,
// all alike, on one line), the busiest marked, and with table.device_bytes
// whether it fits (its peak and the runtime reserve); then the table of
// format_estimate_table for the busiest stage's rank (of the last ZeRO
// stage listed, where they differ), without the largest-model rows.
std::string format_mesh_table(const TransformerShape& shape, const EstimateOptions& options,
                              const TableOptions& table = {});

}  // namespace zest
