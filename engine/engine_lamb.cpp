// The LAMB optimizer on the owned shards (optim/lamb.h): the moments and the
// pieces' sums of every run, the sums added exactly per parameter and
// all-reduced across the shards' ranks, the trust ratios, then the weights.
// Every rank computes each parameter's norms with the same bits, whatever
// the stage and world size (Note [LAMB's norms do not depend on the
// sharding] in optim/lamb.h).
#include <algorithm>

#include "zest/core/check.h"
#include "zest/engine/engine.h"
#include "zest/engine/detail/engine_state.h"
#include "zest/memory/copy.h"
#include "zest/optim/exact_sum.h"
#include "zest/optim/lamb.h"

namespace zest {
namespace {

// The plan of this rank's shards: runs of one group each, and the pieces of
// the parameters inside them.
std::unique_ptr<LambPlan> make_plan(const ModelLayout& L, int part, const std::vector<size_t>& first_device,
                                    const std::vector<const std::vector<GroupRun>*>& runs) {
  auto plan = std::make_unique<LambPlan>();
  uint32_t next_param = 0;
  for (int u = 0; u < L.num_units(); ++u) {
    const UnitLayout& U = L.unit(u);
    if (U.frozen) continue;
    const uint32_t first_param = next_param;
    next_param += static_cast<uint32_t>(U.params.size());
    const size_t shard_start = U.shard * static_cast<size_t>(part);
    const size_t first = first_device[static_cast<size_t>(u)];
    for (const GroupRun& run : *runs[static_cast<size_t>(u)]) {
      const size_t lo = std::max(run.begin, first);
      if (lo >= run.end) continue;
      LambPlan::Run r{u, lo - first, run.end - lo, run.group, plan->pieces.size(), 0};
      for (size_t i = 0; i < U.params.size(); ++i) {
        const ParamLayout& p = U.params[i];
        // The parameter's elements in this run, shard-relative.
        const size_t a = std::max(p.offset, shard_start + lo);
        const size_t b = std::min(p.offset + p.numel, shard_start + run.end);
        if (a >= b) continue;
        lamb_pieces(plan->pieces, a - shard_start, b - shard_start, lo, first_param + static_cast<uint32_t>(i));
      }
      r.pieces = plan->pieces.size() - r.first_piece;
      if (r.pieces > 0) plan->runs.push_back(r);
    }
  }
  plan->params = next_param;
  return plan;
}

}  // namespace

void Engine::Impl::lamb_step(StepScalars scalars, Buffer& workspace) {
  Impl& im = *this;
  const ModelLayout& L = *im.layout_;
  if (!im.lamb_) {
    std::vector<size_t> first(static_cast<size_t>(L.num_units()));
    std::vector<const std::vector<GroupRun>*> runs(first.size());
    for (size_t u = 0; u < first.size(); ++u) {
      first[u] = im.units_[u].host_numel;
      runs[u] = &im.units_[u].runs;
    }
    im.lamb_ = make_plan(L, im.part_, first, runs);
    if (!stream_.device().is_host() && !im.lamb_->pieces.empty()) {
      const size_t bytes = im.lamb_->pieces.size() * sizeof(LambPiece);
      im.lamb_->device_pieces = allocator_.allocate_buffer(bytes, stream_, MemoryCategory::kOptimizerState);
      copy_bytes(stream_, im.lamb_->device_pieces.data(), im.lamb_->pieces.data(), bytes);
      stream_.synchronize();  // the host vector may not move while the copy reads it
    }
  }
  const LambPlan& plan = *im.lamb_;
  const LambPiece* pieces = stream_.device().is_host() ? plan.pieces.data()
                                                       : reinterpret_cast<const LambPiece*>(plan.device_pieces.data());
  const size_t count = plan.pieces.size();
  const size_t word_count = 2 * plan.params * kExactWords;
  // sums (2 doubles per piece), then the parameters' words, then their ratios.
  workspace = allocator_.allocate_buffer(count * 2 * 8 + word_count * 8 + plan.params * 4, stream_,
                                                MemoryCategory::kCommBuffers);
  auto* sums = reinterpret_cast<double*>(workspace.data());
  auto* words = reinterpret_cast<int64_t*>(sums + 2 * count);
  auto* ratios = reinterpret_cast<float*>(words + word_count);
  const auto run_buffers = [&](const LambPlan::Run& r) {
    scalars.weight_decay = L.groups()[static_cast<size_t>(r.group)].weight_decay;
    return device_shard(r.unit).part(r.begin, r.numel);
  };
  for (const LambPlan::Run& r : plan.runs) {
    lamb_moments(stream_, config_.optimizer, run_buffers(r), scalars, pieces + r.first_piece, r.pieces,
                 sums + 2 * r.first_piece);
  }
  fill_zero(stream_, words, word_count * 8);
  lamb_accumulate(stream_, pieces, sums, count, plan.params, words);
  if (L.partitions() > 1) {
    shard_control().all_reduce(words, words, word_count, DType::kInt64, ReduceOp::kSum, stream_);
  }
  lamb_trust_ratios(stream_, config_.optimizer, words, plan.params, ratios);
  for (const LambPlan::Run& r : plan.runs) {
    lamb_apply(stream_, config_.optimizer, run_buffers(r), scalars, pieces + r.first_piece, r.pieces, ratios);
  }
}

}  // namespace zest
