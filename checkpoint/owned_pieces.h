// Internal to checkpoint/: which elements of each unit's shard this rank
// reads, and from where, for load_owned_weights (weights_io.h), and the
// helpers of its reads.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "zest/checkpoint/weights_io.h"

namespace zest::detail {

// One parameter's elements inside this rank's shard of its unit.
struct OwnedPiece {
  const ParamLayout* param;
  OwnedWeightSource from;
  size_t begin, end;  // in the unit's flat buffer
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
