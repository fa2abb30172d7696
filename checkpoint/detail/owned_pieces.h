// Internal to checkpoint/: which elements of each unit's shard this rank
// reads, and from where, for load_owned_weights (weights_io.h), and the
// helpers of its reads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "zest/checkpoint/weights_io.h"

namespace zest::detail {

// Where a parameter's elements lie in its source tensor. A whole
// parameter's element i is the tensor's element i. A tensor-parallel slice
// (ParamSpec::tp_split, this rank's part of a whole tensor in the file)
// comes in runs of `run` elements, contiguous in both: with the split's
// dimension d of local size L (the whole tensor's L x tp), `inner` the
// elements of the dimensions after d and the split's stride s, a run is one
// of the s blocks of L / s rows of d for one index of the dimensions before
// d, and this rank's block b is the whole tensor's block b x tp + tp_rank.
struct SourceMap {
  size_t run = 0;          // 0: the same offsets
  size_t stride = 1;       // runs per index of the outer dimensions
  size_t outer_step = 0;   // the whole tensor's elements per outer index
  size_t block_step = 0;   // the whole tensor's elements between this rank's blocks
  size_t rank_offset = 0;  // where this rank's first block starts within an outer index

  // The source tensor's element for the parameter's element i.
  size_t at(size_t i) const {
    if (run == 0) return i;
    const size_t q = i / run;
    return (q / stride) * outer_step + (q % stride) * block_step + rank_offset + i % run;
  }
  // Elements from i to the end of its run (the longest contiguous read).
  size_t contiguous_from(size_t i, size_t limit) const { return run == 0 ? limit : std::min(limit, run - i % run); }
};

// The map of parameter p's elements into its source, tp_rank's part of
// tp_size; throws a zest::Error when its split does not divide.
SourceMap source_map(const ParamLayout& p, int tp_rank, int tp_size);

// One parameter's elements inside this rank's shard of its unit.
struct OwnedPiece {
  const ParamLayout* param;
  OwnedWeightSource from;
  size_t begin, end;  // in the unit's flat buffer
  SourceMap map;      // where param's elements are in `from`
};

struct OwnedReads {
  std::vector<std::vector<OwnedPiece>> pieces;  // by unit, in layout order
  // By unit: whether a parameter without a source has elements in the shard
  // (it keeps its values).
  std::vector<bool> keeps_some;
  uint64_t total = 0;  // tensor bytes this rank reads
  size_t largest = 0;  // the largest shard, in elements
};

OwnedReads plan_owned_reads(Engine& engine, const std::function<OwnedWeightSource(const ParamLayout&)>& source);

// Runs work(reports) on n threads, this one (reports = true) and n - 1
// more, and rethrows the first exception any of them threw, after calling
// stop() so that the others finish early.
void run_on_threads(size_t n, const std::function<void(bool reports)>& work, const std::function<void()>& stop);

// The progress a start from weights restores: step counts at 0, this
// engine's loss scaler and set_lr() value.
Engine::Progress restarted_progress(const Engine& engine);

}  // namespace zest::detail
