// Which rows of which epoch a training step reads: the global batch of
// `global_batch` rows (every rank's micro-batches together) taken in order
// from the epoch's RowPlan, and an epoch's tail that fills no whole batch
// dropped (DistributedSampler's drop_last). Epochs follow one another, each
// with its own shuffle (and so, packed, its own number of rows): the data
// position of run step s is a function of s alone, so a run resumed from a
// checkpoint at step s reads what the uninterrupted run read from there.
//
// A rank's share of a step's batch is rows [rank x per_rank, (rank + 1) x
// per_rank) of it, each micro-batch a consecutive part of those: which rows
// form the global batch does not depend on the world size, and with a loss
// normalized by the global batch's trained tokens (not by a micro-batch's)
// neither does the update.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "zest/data/packed_rows.h"

namespace zest {

class GlobalBatches {
 public:
  // Throws when epoch 0 has fewer rows than one global batch, naming both.
  GlobalBatches(const TokenDataset& data, RowPlanOptions options, int64_t global_batch);

  // Steps in `epoch`: its rows / global_batch, rounded down.
  int64_t steps_in_epoch(int64_t epoch);
  int64_t global_batch() const { return global_batch_; }
  // The epoch and the batch within it of run step `step`.
  std::pair<int64_t, int64_t> position(int64_t step);
  // Row `i` (0 <= i < global_batch) of step `step`'s global batch.
  std::span<const RowPiece> row(int64_t step, int64_t i);
  // The plan of `epoch` (built when first asked for; one kept).
  const RowPlan& plan(int64_t epoch);

 private:
  const TokenDataset& data_;
  RowPlanOptions options_;
  int64_t global_batch_;
  std::vector<int64_t> epoch_steps_;  // of the epochs counted so far
  int64_t epoch_ = -1;
  std::unique_ptr<RowPlan> plan_;
};

}  // namespace zest
