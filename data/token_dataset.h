// Tokenized documents as fine-tuning reads them: the data a tokenizer
// already made, in the formats Megatron-LM and Hugging Face `datasets`
// write (megatron_dataset.h, tokenized_jsonl.h), each document read on its
// own so that a rank reads only the rows it trains on.
//
// A document's labels follow Hugging Face's convention: the token itself
// where the model is trained to predict it, kIgnoreIndex (-100) where not
// (a prompt under instruction masking). Shifting them into next-token
// targets is packed_rows.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace zest {

// The label of a token not trained on (torch's cross_entropy ignore_index,
// Hugging Face's -100).
inline constexpr int64_t kIgnoreIndex = -100;

struct TokenDocument {
  std::vector<int64_t> tokens;
  // Per token, as above; empty: every token is trained on.
  std::vector<int64_t> labels;
};

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  // Documents.
  virtual int64_t size() const = 0;
  // Document d's tokens, known without reading them (the row plan needs
  // every document's length on every rank).
  virtual int64_t length(int64_t d) const = 0;
  // Document d, read now; throws naming the file and the document where its
  // bytes are wrong or a token is not below the vocabulary size given.
  virtual TokenDocument document(int64_t d) const = 0;
  // The file or prefix it reads, for messages.
  virtual const std::string& path() const = 0;
};

// The formats by name: "megatron" (path: the prefix of PATH.bin and
// PATH.idx) and "jsonl" (tokenized records). vocab_size > 0: every token
// read is checked against it. Throws naming the format for any other.
std::unique_ptr<TokenDataset> open_token_dataset(const std::string& format, const std::string& path,
                                                 int64_t vocab_size);

}  // namespace zest
