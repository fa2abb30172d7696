// A checkpoint's SentencePiece tokenizer (`tokenizer.model`), run as
// Hugging Face's LlamaTokenizerFast runs it: the tokenizer Llama 1/2,
// Mistral and their fine-tunes ship, which AutoTokenizer loads.
//
//   // zest-example
//   zest::HfTokenizer tok("checkpoints/Mistral-7B-v0.3");  // or .../tokenizer.model
//   std::vector<int64_t> ids = tok.encode("[INST] Hello [/INST]", /*add_special_tokens=*/true);
//   // {1, 3, 23325, 29473, 4}: <s>, [INST], ▁Hello, ▁, [/INST]
//
// Encoding follows transformers' LlamaConverter and tokenizers' pipeline:
//
//   1. The text is split at the added tokens (tokenizer_config.json's
//      added_tokens_decoder, else tokenizer.json's added_tokens, else the
//      model's <unk>, <s> and </s>), leftmost-longest, each becoming its id;
//      lstrip/rstrip take the whitespace beside it.
//   2. Each piece between them is encoded by the SentencePiece model with
//      the prefix space of the tokenizer's layout: legacy (a "▁" before
//      every piece: tokenizer.json's Prepend normalizer, or `legacy` true or
//      absent in tokenizer_config.json), or Metaspace "first" (a "▁" before
//      the piece that starts the text, unless it starts with a space:
//      `legacy: false`), or none (`add_prefix_space: false`).
//   3. <s> first when add_bos_token (default true), </s> last when
//      add_eos_token (default false).
//
// tokenizer.json, when present, decides the layout of step 2 (as it does
// for AutoTokenizer), else tokenizer_config.json does. What would make the
// ids differ from Hugging Face's is refused by name: a tokenizer_class other
// than LlamaTokenizer(Fast), a SentencePiece normalizer other than
// "identity" or one that removes whitespace, a single_word added token, a
// tokenizer.json pipeline of another shape. A directory with tokenizer.json
// and no tokenizer.model (byte-level BPE: Llama 3, Qwen) is refused, naming
// the pre-tokenized formats that take its output.
//
// Built without SentencePiece (libsentencepiece-dev), the constructor
// throws saying so. Encoding is const and safe from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace zest {

// Whether this build can read tokenizer.model.
bool has_sentencepiece();

class HfTokenizer {
 public:
  // `path`: a checkpoint directory (tokenizer.model, tokenizer_config.json
  // and tokenizer.json read from it) or a tokenizer.model file (the
  // configuration files beside it read too).
  explicit HfTokenizer(const std::string& path);
  ~HfTokenizer();
  HfTokenizer(HfTokenizer&&) noexcept;
  HfTokenizer& operator=(HfTokenizer&&) noexcept;

  // The ids of `text`, with <s>/</s> as add_bos_token/add_eos_token say
  // when add_special_tokens (transformers' default).
  std::vector<int64_t> encode(std::string_view text, bool add_special_tokens = true) const;

  int64_t vocab_size() const;  // the model's pieces and the added tokens above them
  int64_t bos_id() const;
  int64_t eos_id() const;
  const std::string& eos_token() const;  // its text, as TRL appends it
  // One line: the file, vocabulary, layout and special tokens, for logs.
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace zest
