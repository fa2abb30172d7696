#include "zest/data/global_batch.h"

#include "zest/core/check.h"

namespace zest {

GlobalBatches::GlobalBatches(const TokenDataset& data, RowPlanOptions options, int64_t global_batch)
    : data_(data), options_(options), global_batch_(global_batch) {
  ZEST_CHECK(global_batch > 0, "a global batch of {} rows: give at least 1", global_batch);
  const int64_t rows = plan(0).rows();
  ZEST_CHECK(rows >= global_batch,
             "{}: {} document(s) make {} row(s) of at most {} tokens{}, fewer than one global batch of {} rows: "
             "lower the batch, or give more data",
             data.path(), data.size(), rows, options.max_seq_len, options.packing ? " packed" : "", global_batch);
}

int64_t GlobalBatches::steps_in_epoch(int64_t epoch) {
  ZEST_CHECK(epoch >= 0, "epoch {} is negative", epoch);
  while (static_cast<int64_t>(epoch_steps_.size()) <= epoch) {
    const int64_t e = static_cast<int64_t>(epoch_steps_.size());
    epoch_steps_.push_back(plan(e).rows() / global_batch_);
  }
  return epoch_steps_[static_cast<size_t>(epoch)];
}

std::pair<int64_t, int64_t> GlobalBatches::position(int64_t step) {
  ZEST_CHECK(step >= 0, "step {} is negative", step);
  int64_t epoch = 0;
  for (int64_t n = steps_in_epoch(0); step >= n; n = steps_in_epoch(++epoch)) step -= n;
  return {epoch, step};
}

std::span<const RowPiece> GlobalBatches::row(int64_t step, int64_t i) {
  ZEST_CHECK(i >= 0 && i < global_batch_, "row {} of a global batch of {}", i, global_batch_);
  const auto [epoch, batch] = position(step);
  return plan(epoch).row(batch * global_batch_ + i);
}

const RowPlan& GlobalBatches::plan(int64_t epoch) {
  if (epoch != epoch_) {
    plan_ = std::make_unique<RowPlan>(data_, epoch, options_);
    epoch_ = epoch;
  }
  return *plan_;
}

}  // namespace zest
