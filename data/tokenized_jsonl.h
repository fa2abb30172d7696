// JSON Lines of tokenized records, as Hugging Face `datasets` writes a
// tokenized dataset with to_json(): one object per line,
//
//   {"input_ids": [1, 518, 25580, ...], "labels": [-100, -100, 25580, ...], "attention_mask": [1, 1, 1, ...]}
//
//   input_ids        required, non-empty, integers >= 0
//   labels           optional, as long as input_ids: the token to predict at
//                    each position, -100 where none (instruction masking);
//                    absent: every token is trained on
//   attention_mask   optional, as long as input_ids, 0 or 1: the 0s are
//                    padding a collator added, at the start or the end of the
//                    record, and are dropped with their labels; a 0 between
//                    1s is refused (the record would not be one sequence)
//
// Other keys (text, id, ...) are ignored: they change nothing of what is
// trained. A record of text without input_ids is refused with the formats
// that are tokenized. Blank lines are skipped. The file is read once when
// opened, to check every record and learn its length (errors name the line),
// and then a record at a time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zest/core/file_io.h"
#include "zest/data/jsonl_lines.h"
#include "zest/data/token_dataset.h"

namespace zest {

class TokenizedJsonl final : public TokenDataset {
 public:
  explicit TokenizedJsonl(const std::string& path, int64_t vocab_size = 0);

  int64_t size() const override { return index_.size(); }
  int64_t length(int64_t d) const override { return index_.length(d); }
  TokenDocument document(int64_t d) const override;
  const std::string& path() const override { return path_; }

  // The 1-based line of record d, for messages.
  int64_t line_of(int64_t d) const { return index_.line_of(d); }

 private:
  std::string path_;
  int64_t vocab_size_;
  ReadOnlyFile file_;
  JsonlIndex index_;  // lengths: tokens after padding is dropped
};

}  // namespace zest
