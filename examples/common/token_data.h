// Fine-tuning data for the libtorch language-model examples: a tokenized
// dataset (zest/data: Megatron's indexed dataset or tokenized JSONL) as the
// micro-batches of each step, the global batch's trained-token count, and
// the loss of held-out data.
//
//   --format megatron|jsonl --data PATH     the training set (PATH.bin/.idx, or a .jsonl)
//   --format text --data PATH                text JSONL (prompt/completion or text), tokenized
//                                            with the checkpoint's tokenizer.model
//   --tokenizer PATH                         its directory or file (default: --hf's)
//   --val-data PATH                          held-out data of the same format
//   --max-seq-len N                          tokens a row (default --context)
//   --packing                                several documents a row, attention within each
//   --epochs N                               train N epochs (instead of --steps)
//
// Without --format (or with --format fortunes) the examples read their
// byte-level fortune corpus (common/corpus.h) as before.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cli/cli.h"
#include "common/corpus.h"
#include "common/mesh_trainer.h"
#include "zest/data/global_batch.h"
#include "zest/data/token_dataset.h"
#include "zest/engine/engine.h"

namespace examples {

struct TokenDataFlags {
  std::string format = "fortunes";
  std::string tokenizer;  // --format text: a checkpoint directory or tokenizer.model
  std::string val_data;
  int64_t max_seq_len = 0;  // 0: the example's --context
  bool packing = false;
  int64_t epochs = 0;  // 0: --steps decides

  bool tokenized() const { return format != "fortunes"; }
};

// --format, --tokenizer, --val-data, --max-seq-len, --packing, --epochs.
void add_token_data_flags(cli::App& app, TokenDataFlags& flags);
// After parsing: throws cli::UsageError for a flag that needs --format, and
// for --format text without a tokenizer (--tokenizer, else `hf_dir`, which
// becomes flags.tokenizer).
void check_token_data_flags(TokenDataFlags& flags, const std::string& hf_dir = "");

// `path` in flags.format (text: tokenized with flags.tokenizer), tokens
// checked against `vocab`.
std::unique_ptr<zest::TokenDataset> open_dataset(const TokenDataFlags& flags, const std::string& path, int64_t vocab);

// Rows of `data` as a Batch [rows, pad_to]: tokens, targets, and for packed
// rows positions and document ids.
Batch to_batch(const zest::TokenDataset& data, const std::vector<std::vector<zest::RowPiece>>& rows, int64_t pad_to,
               bool packed);

class TokenData {
 public:
  // Opens `path` in flags.format, tokens checked against `vocab`; rows of
  // max_seq_len, shuffled per epoch from `seed`.
  TokenData(const TokenDataFlags& flags, const std::string& path, int64_t vocab, int64_t max_seq_len,
            int64_t global_batch, uint64_t seed);

  // Rows [first, first + count) of step `step`'s global batch.
  Batch rows(int64_t step, int64_t first, int64_t count);
  // The steps of the first `epochs` epochs.
  int64_t steps(int64_t epochs);
  // The epoch and batch of run step `step`.
  std::pair<int64_t, int64_t> position(int64_t step) { return batches_.position(step); }
  const zest::TokenDataset& dataset() const { return *data_; }
  const zest::RowPlan& plan(int64_t epoch) { return batches_.plan(epoch); }

 private:
  std::unique_ptr<zest::TokenDataset> data_;
  int64_t max_seq_len_;
  bool packing_;
  zest::GlobalBatches batches_;
};

// The trained tokens (targets other than -100) of every rank's
// micro-batches together: a sum over the engine's group. Collective.
int64_t global_trained_tokens(zest::Engine& engine, const std::vector<Batch>& micro_batches);

struct HeldOutLoss {
  double loss = 0.0;        // the mean over the trained tokens
  double perplexity = 0.0;  // exp(loss)
  int64_t tokens = 0;       // trained tokens
  int64_t rows = 0;
};
// The loss of held-out data: its rows in file order (packed as training
// packs them), rank r taking rows r, r + ranks, ..., `chunk` rows a
// forward; every rank runs as many forwards (empty rows pad the last), as
// stage 3's gathers are collective. The same value on every rank.
HeldOutLoss held_out_loss(zest::Engine& engine, MeshTrainer& trainer, const zest::TokenDataset& data,
                          zest::RowPlanOptions options, int64_t chunk);

}  // namespace examples
