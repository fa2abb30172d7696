#include "zest/data/megatron_dataset.h"

#include <bit>
#include <cstring>
#include <string_view>

#include "zest/core/check.h"

namespace zest {

namespace {

static_assert(std::endian::native == std::endian::little, "the index is read as little-endian bytes");

constexpr std::string_view kMagic("MMIDIDX\0\0", 9);
constexpr size_t kHeaderBytes = 9 + 8 + 1 + 8 + 8;

template <typename T>
T read_le(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Bytes of a token of dtype code `code`; 0 where the code holds no token ids.
int token_bytes(int code) {
  switch (code) {
    case 1: case 2: return 1;   // uint8, int8
    case 3: case 8: return 2;   // int16, uint16
    case 4: return 4;           // int32
    case 5: return 8;           // int64
    default: return 0;
  }
}

int64_t token_at(const std::byte* p, int code) {
  switch (code) {
    case 1: return read_le<uint8_t>(p);
    case 2: return read_le<int8_t>(p);
    case 3: return read_le<int16_t>(p);
    case 4: return read_le<int32_t>(p);
    case 5: return read_le<int64_t>(p);
    default: return read_le<uint16_t>(p);  // 8
  }
}

}  // namespace

MegatronDataset::MegatronDataset(const std::string& prefix, int64_t vocab_size)
    : prefix_(prefix),
      vocab_size_(vocab_size),
      idx_file_(prefix + ".idx", {.follow_links = true}),
      bin_file_(prefix + ".bin", {.follow_links = true}) {
  const std::string idx_path = idx_file_.path();
  const uint64_t idx_bytes = idx_file_.size();
  ZEST_CHECK(idx_bytes >= kHeaderBytes,
             "{}: {} bytes, shorter than a Megatron index's {}-byte header: the file is truncated or not an index "
             "(write it with Megatron-LM's tools/preprocess_data.py)",
             idx_path, idx_bytes, kHeaderBytes);
  idx_ = idx_file_.view(0, idx_bytes);
  idx_.populate(0, idx_bytes);
  const std::byte* p = idx_.bytes().data();
  ZEST_CHECK(std::memcmp(p, kMagic.data(), kMagic.size()) == 0,
             "{}: no Megatron index header (MMIDIDX\\0\\0) but '{}': not an mmap indexed dataset's .idx (the "
             "older 'cached' format, TNTIDX, is not read: convert it with Megatron-LM's tools)",
             idx_path, escape_for_message(std::string_view(reinterpret_cast<const char*>(p), 9)));
  const uint64_t version = read_le<uint64_t>(p + 9);
  ZEST_CHECK(version == 1, "{}: index version {}, where Megatron-LM writes 1", idx_path, version);
  code_ = static_cast<int>(read_le<uint8_t>(p + 17));
  ZEST_CHECK(code_ != 6 && code_ != 7, "{}: the tokens are {} (dtype code {}), which holds no token ids", idx_path,
             code_ == 6 ? "float64" : "float32", code_);
  item_ = token_bytes(code_);
  ZEST_CHECK(item_ > 0, "{}: dtype code {} is none of Megatron's (1-8)", idx_path, code_);
  const uint64_t s = read_le<uint64_t>(p + 18), d1 = read_le<uint64_t>(p + 26);
  // Each count bounded by the file's size first, so no product overflows.
  ZEST_CHECK(s <= idx_bytes / 12 && d1 <= idx_bytes / 8,
             "{}: {} sequences and {} document indices cannot fit in {} bytes: the index is damaged", idx_path, s,
             d1, idx_bytes);
  const uint64_t expected = kHeaderBytes + 12 * s + 8 * d1;
  ZEST_CHECK(idx_bytes != expected + s || s == 0,
             "{}: the index carries sequence modes (a multimodal dataset): only token datasets are read", idx_path);
  ZEST_CHECK(idx_bytes == expected,
             "{}: {} bytes, where {} sequences and {} document indices take {}: the index is {}", idx_path,
             idx_bytes, s, d1, expected, idx_bytes < expected ? "truncated" : "followed by bytes of something else");
  ZEST_CHECK(d1 >= 1, "{}: no document indices (Megatron-LM writes at least the leading 0)", idx_path);
  sequences_ = static_cast<int64_t>(s);
  documents_ = static_cast<int64_t>(d1) - 1;
  lengths_at_ = kHeaderBytes;
  pointers_at_ = lengths_at_ + 4 * s;
  documents_at_ = pointers_at_ + 8 * s;

  const uint64_t bin_bytes = bin_file_.size();
  for (int64_t i = 0; i < sequences_; ++i) {
    const int64_t length = sequence_length(i), pointer = sequence_pointer(i);
    ZEST_CHECK(length >= 0 && pointer >= 0, "{}: sequence {} has length {} at byte {}: the index is damaged",
               idx_path, i, length, pointer);
    ZEST_CHECK(static_cast<uint64_t>(pointer) <= bin_bytes &&
                   static_cast<uint64_t>(length) <= (bin_bytes - static_cast<uint64_t>(pointer)) / static_cast<uint64_t>(item_),
               "{}: sequence {} ({} tokens of {} bytes at byte {}) ends past the end of {} ({} bytes): the .bin is "
               "truncated or belongs to another index",
               idx_path, i, length, item_, pointer, bin_file_.path(), bin_bytes);
  }
  ZEST_CHECK(document_index(0) == 0, "{}: the first document starts at sequence {}, not 0", idx_path,
             document_index(0));
  for (int64_t d = 0; d < documents_; ++d) {
    ZEST_CHECK(document_index(d + 1) >= document_index(d),
               "{}: document {} ends at sequence {}, before it starts ({}): the document indices are out of order",
               idx_path, d, document_index(d + 1), document_index(d));
  }
  ZEST_CHECK(document_index(documents_) == sequences_,
             "{}: the documents end at sequence {}, but the index has {} sequences: the document indices are "
             "damaged",
             idx_path, document_index(documents_), sequences_);
  if (bin_bytes > 0) bin_ = bin_file_.view(0, bin_bytes);
}

int64_t MegatronDataset::sequence_length(int64_t s) const {
  return read_le<int32_t>(idx_.bytes().data() + lengths_at_ + 4 * static_cast<size_t>(s));
}

int64_t MegatronDataset::sequence_pointer(int64_t s) const {
  return read_le<int64_t>(idx_.bytes().data() + pointers_at_ + 8 * static_cast<size_t>(s));
}

int64_t MegatronDataset::document_index(int64_t d) const {
  return read_le<int64_t>(idx_.bytes().data() + documents_at_ + 8 * static_cast<size_t>(d));
}

int64_t MegatronDataset::length(int64_t d) const {
  ZEST_CHECK(d >= 0 && d < documents_, "{}: document {} of {}", prefix_, d, documents_);
  int64_t n = 0;
  for (int64_t s = document_index(d); s < document_index(d + 1); ++s) n += sequence_length(s);
  return n;
}

TokenDocument MegatronDataset::document(int64_t d) const {
  TokenDocument doc;
  doc.tokens.reserve(static_cast<size_t>(length(d)));
  for (int64_t s = document_index(d); s < document_index(d + 1); ++s) {
    const size_t at = static_cast<size_t>(sequence_pointer(s)), n = static_cast<size_t>(sequence_length(s));
    if (n == 0) continue;
    bin_.populate(at, n * static_cast<size_t>(item_));
    const std::byte* p = bin_.bytes().data() + at;
    for (size_t i = 0; i < n; ++i) {
      const int64_t token = token_at(p + i * static_cast<size_t>(item_), code_);
      ZEST_CHECK(token >= 0 && (vocab_size_ <= 0 || token < vocab_size_),
                 "{}.bin: document {} (sequence {}), token {} is {}, outside the model's vocabulary [0, {}): the "
                 "data was tokenized for another model",
                 prefix_, d, s, i, token, vocab_size_ > 0 ? vocab_size_ : INT64_MAX);
      doc.tokens.push_back(token);
    }
  }
  return doc;
}

}  // namespace zest
