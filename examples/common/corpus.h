// The text the libtorch examples (gpt, llama) learn: the fortune cookies of Debian's
// `fortunes` package (/usr/share/games/fortunes; scripts/setup.sh installs
// it), tokenized by bytes, with a held-out validation split.
//
// A fortune file holds cookies separated by lines of a single '%'. The
// files of a directory are read in name order (the strfile indexes, *.dat,
// and the *.u8 links are skipped), and cookie i of that order is held out
// for validation when i % 20 == 0: about 5%, the same on every machine and
// at every world size. Each split is its cookies, each followed by "%\n".
//
//   examples::Corpus corpus = examples::Corpus::load("/usr/share/games/fortunes");
//   examples::Batch b = corpus.train_batch(step, /*first_row=*/rank * rows, rows, /*context=*/64, seed);
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <torch/torch.h>

namespace examples {

// Inputs and next-token targets, both [rows, context] int64 (a target of
// -100 is not trained on). Packed rows (common/token_data.h) also carry
// each token's position and document id, [rows, context]; undefined
// otherwise.
struct Batch {
  torch::Tensor inputs;
  torch::Tensor targets;
  torch::Tensor positions;
  torch::Tensor documents;
};

class Corpus {
 public:
  // A directory of fortune files or one file. Throws std::runtime_error
  // naming the path, and saying how to get the corpus, when it is missing,
  // unreadable or too short for a validation split.
  static Corpus load(const std::string& path);
  // From text already in memory (tests): the same cookie split.
  static Corpus from_text(const std::string& text);

  const std::string& train() const { return train_; }
  const std::string& validation() const { return validation_; }
  size_t cookies() const { return cookies_; }

  // Rows [first_row, first_row + rows) of step `step`'s global batch: each
  // row a window of context + 1 bytes of the training split, at an offset
  // drawn from (seed, step, row) alone, so a row is the same whichever rank
  // takes it. Throws when the split is not longer than context.
  Batch train_batch(int64_t step, int64_t first_row, int64_t rows, int64_t context, uint64_t seed) const;
  // The validation split as consecutive, non-overlapping windows (at most
  // `max_windows` of them), windows [first, first + count) of that list.
  Batch validation_windows(int64_t first, int64_t count, int64_t context) const;
  // How many windows validation_windows can give, at most max_windows.
  int64_t validation_window_count(int64_t context, int64_t max_windows) const;

 private:
  std::string train_;
  std::string validation_;
  size_t cookies_ = 0;
};

// Bytes as tokens and back.
torch::Tensor encode(const std::string& text);  // [1, n] int64
std::string decode(const torch::Tensor& tokens);  // any shape, values 0-255

}  // namespace examples
