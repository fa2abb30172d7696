// JSON Lines of text records, tokenized as they are read with the
// checkpoint's tokenizer (hf_tokenizer.h), as TRL's SFTTrainer prepares a
// dataset of the same records:
//
//   {"prompt": "What is ZeRO?", "completion": " Sharded optimizer state."}
//   {"text": "A document trained on whole."}
//
//   prompt, completion   TRL's prompt-completion records: the completion
//                        gets the tokenizer's eos_token appended unless it
//                        ends with it; the ids are those of prompt +
//                        completion (special tokens added), and the first
//                        len(ids of the prompt alone) of them are not
//                        trained on (label -100): TRL's completion_mask,
//                        completion_only_loss. Where the prompt's ids are
//                        not the start of the whole's, TRL warns and masks
//                        the same count; so does this, once, with the
//                        number of such records.
//   text                 TRL's language-modeling records (its
//                        dataset_text_field): eos_token appended unless
//                        present, every token trained on.
//
// A record with "prompt" is prompt-completion (as in TRL, whatever else it
// holds). Conversational records ("messages", or a prompt that is a list of
// turns) need the model's chat template, which ZEST does not run: refused,
// naming the pre-tokenized formats. Every record is tokenized once when the
// file is opened (the row plan needs each length; errors name the line) and
// again when read. Other keys are ignored.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "zest/core/file_io.h"
#include "zest/data/jsonl_lines.h"
#include "zest/data/token_dataset.h"
#include "zest/tokenizer/hf_tokenizer.h"

namespace zest {

class TextJsonl final : public TokenDataset {
 public:
  // vocab_size > 0: the model's vocabulary, which every id must be below.
  TextJsonl(const std::string& path, std::shared_ptr<const HfTokenizer> tokenizer, int64_t vocab_size = 0);

  int64_t size() const override { return index_.size(); }
  int64_t length(int64_t d) const override { return index_.length(d); }
  TokenDocument document(int64_t d) const override;
  const std::string& path() const override { return path_; }

  int64_t line_of(int64_t d) const { return index_.line_of(d); }
  // Records whose prompt's ids are not the start of prompt + completion's.
  int64_t mismatched_prompts() const { return mismatched_; }

 private:
  std::string path_;
  std::shared_ptr<const HfTokenizer> tokenizer_;
  int64_t vocab_size_;
  ReadOnlyFile file_;
  JsonlIndex index_;
  int64_t mismatched_ = 0;
};

}  // namespace zest
