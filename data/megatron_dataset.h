// Megatron-LM's indexed dataset: PATH.bin holds the tokens of every
// sequence back to back, PATH.idx describes them, as
// megatron/core/datasets/indexed_dataset.py's _IndexWriter writes it (and
// tools/preprocess_data.py through it):
//
//   "MMIDIDX\0\0"                    9 bytes
//   version                         uint64, 1
//   token dtype code                uint8: 1 uint8, 2 int8, 3 int16, 4 int32,
//                                   5 int64, 8 uint16 (6 float64 and
//                                   7 float32 hold no token ids: refused)
//   sequence count S, document count D + 1   uint64 each
//   sequence lengths                int32[S], in tokens
//   sequence pointers               int64[S], byte offsets into PATH.bin
//   document indices                int64[D + 1]: document d is sequences
//                                   [idx[d], idx[d + 1]); idx[0] = 0, idx[D] = S
//   (multimodal files add int8[S] of sequence modes: refused by name)
//
// All little-endian, unaligned. Both files are memory-mapped: the index is
// checked whole when opened (every sequence inside PATH.bin, the document
// indices in order), a document's tokens are read when asked for. A
// document is its sequences concatenated (preprocess_data.py writes one
// sequence per document unless --split-sentences), with no labels: every
// token is trained on.
#pragma once

#include <cstdint>
#include <string>

#include "zest/core/file_io.h"
#include "zest/core/file_view.h"
#include "zest/data/token_dataset.h"

namespace zest {

class MegatronDataset final : public TokenDataset {
 public:
  // `prefix`: the path without ".bin"/".idx". vocab_size > 0: tokens are
  // checked against it as they are read.
  explicit MegatronDataset(const std::string& prefix, int64_t vocab_size = 0);

  int64_t size() const override { return documents_; }
  int64_t length(int64_t d) const override;
  TokenDocument document(int64_t d) const override;
  const std::string& path() const override { return prefix_; }

  int64_t sequences() const { return sequences_; }
  // The dtype code of the tokens (see the header comment) and its bytes.
  int dtype_code() const { return code_; }
  int item_bytes() const { return item_; }

 private:
  int64_t sequence_length(int64_t s) const;
  int64_t sequence_pointer(int64_t s) const;
  int64_t document_index(int64_t d) const;

  std::string prefix_;
  int64_t vocab_size_;
  ReadOnlyFile idx_file_, bin_file_;
  FileView idx_, bin_;
  int code_ = 0, item_ = 0;
  int64_t sequences_ = 0, documents_ = 0;
  size_t lengths_at_ = 0, pointers_at_ = 0, documents_at_ = 0;  // byte offsets in idx_
};

}  // namespace zest
