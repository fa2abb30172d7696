// Rows of tokens for fine-tuning, from the documents of a TokenDataset: the
// order of an epoch, documents packed into rows (or one to a row), and a
// row's tokens, next-token targets, position ids and document ids.
//
//   // zest-example: prelude=token_rows
//   zest::RowPlan plan(dataset, /*epoch=*/0, {.max_seq_len = 2048, .packing = true, .seed = 42});
//   for (int64_t r = 0; r < plan.rows(); ++r) {
//     zest::TokenRow row = zest::make_row(dataset, plan.row(r), /*pad_to=*/2048);
//     (void)row;  // tokens, targets, positions, documents
//   }
//
// The order: documents shuffled per epoch as torch.randperm with a
// generator seeded seed + epoch (DistributedSampler's seeding,
// distributed_sampler.h), or in file order. A document longer than
// max_seq_len keeps its first max_seq_len tokens (torchtune's and TRL's
// truncation). Packing (TRL's padding-free packing, torchtune's
// PackedDataset without splitting): documents go into the current row in
// that order while they fit, and a document that does not fit starts the
// next row; a document is never split across rows. Without packing each
// document is a row.
//
// Targets are Hugging Face's shifted labels: position t of a document is
// trained to predict its label at t + 1 (the token itself unless the
// labels mask it, -100), and the last token of each document predicts
// nothing (-100): nothing is learned across a document boundary
// (DataCollatorWithFlattening's -100 separator). Position ids restart at 0
// with each document; document ids number the documents of a row from 0, so
// attention stays within a document (block-diagonal causal). Padding, at
// the end of a row: token pad_id, target -100, position 0, document -1.
//
// Everything depends on the dataset, the epoch and the options alone, so
// every rank computes the same plan, and a global batch's rows are the same
// whatever the world size (global_batch.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "zest/data/token_dataset.h"

namespace zest {

struct RowPlanOptions {
  int64_t max_seq_len = 0;  // tokens per row, > 1
  bool packing = false;
  bool shuffle = true;
  uint64_t seed = 0;
};

// A document's first `tokens` tokens in a row.
struct RowPiece {
  int64_t document = 0;
  int64_t tokens = 0;
};

class RowPlan {
 public:
  RowPlan(const TokenDataset& data, int64_t epoch, RowPlanOptions options);

  int64_t rows() const { return static_cast<int64_t>(row_begin_.size()); }
  std::span<const RowPiece> row(int64_t r) const;
  // Documents cut to max_seq_len, and the tokens they lost.
  int64_t truncated_documents() const { return truncated_; }
  int64_t truncated_tokens() const { return truncated_tokens_; }
  // Tokens in all rows (padding not counted).
  int64_t tokens() const { return tokens_; }
  const RowPlanOptions& options() const { return options_; }

 private:
  RowPlanOptions options_;
  std::vector<RowPiece> pieces_;
  std::vector<int64_t> row_begin_;  // index into pieces_ of each row's first
  int64_t truncated_ = 0, truncated_tokens_ = 0, tokens_ = 0;
};

struct TokenRow {
  std::vector<int64_t> tokens;
  std::vector<int64_t> targets;
  std::vector<int64_t> positions;
  std::vector<int64_t> documents;
  // Targets other than -100.
  int64_t trained() const;
};

// The row made of `pieces` (RowPlan::row), padded to pad_to tokens (at least
// the pieces' total).
TokenRow make_row(const TokenDataset& data, std::span<const RowPiece> pieces, int64_t pad_to, int64_t pad_id = 0);

}  // namespace zest
