// zest_sentencepiece: see sentencepiece_shim.h. Built only where
// libsentencepiece-dev is installed; exceptions never cross the C boundary.
#include "zest/tokenizer/detail/sentencepiece_shim.h"

#include <sentencepiece_processor.h>

#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace {

using sentencepiece::SentencePieceProcessor;

void put_error(std::string_view message, char* error, size_t capacity) {
  if (error == nullptr || capacity == 0) return;
  const size_t n = std::min(message.size(), capacity - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

const SentencePieceProcessor& sp(const void* p) { return *static_cast<const SentencePieceProcessor*>(p); }

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* zest_spm_load(const char* model, size_t bytes, char* error,
                                                            size_t capacity) {
  try {
    auto* p = new SentencePieceProcessor();
    const auto status = p->LoadFromSerializedProto(std::string_view(model, bytes));
    if (!status.ok()) {
      put_error(status.ToString(), error, capacity);
      delete p;
      return nullptr;
    }
    return p;
  } catch (const std::exception& e) {
    put_error(e.what(), error, capacity);
    return nullptr;
  }
}

__attribute__((visibility("default"))) void zest_spm_free(void* processor) {
  delete static_cast<SentencePieceProcessor*>(processor);
}

__attribute__((visibility("default"))) int zest_spm_encode(const void* processor, const char* text, size_t bytes,
                                                            void (*sink)(void*, const int*, size_t), void* context,
                                                            char* error, size_t capacity) {
  try {
    std::vector<int> ids;
    const auto status = sp(processor).Encode(std::string_view(text, bytes), &ids);
    if (!status.ok()) {
      put_error(status.ToString(), error, capacity);
      return 1;
    }
    sink(context, ids.data(), ids.size());
    return 0;
  } catch (const std::exception& e) {
    put_error(e.what(), error, capacity);
    return 1;
  }
}

__attribute__((visibility("default"))) int zest_spm_piece_size(const void* processor) {
  return sp(processor).GetPieceSize();
}

__attribute__((visibility("default"))) int zest_spm_piece_to_id(const void* processor, const char* piece,
                                                                 size_t bytes) {
  const std::string_view want(piece, bytes);
  const int id = sp(processor).PieceToId(want);
  return sp(processor).IdToPiece(id) == want ? id : -1;
}

__attribute__((visibility("default"))) const char* zest_spm_id_to_piece(const void* processor, int id,
                                                                         size_t* bytes) {
  if (id < 0 || id >= sp(processor).GetPieceSize()) return nullptr;
  const std::string& piece = sp(processor).IdToPiece(id);
  *bytes = piece.size();
  return piece.data();
}

__attribute__((visibility("default"))) int zest_spm_bos_id(const void* processor) { return sp(processor).bos_id(); }
__attribute__((visibility("default"))) int zest_spm_eos_id(const void* processor) { return sp(processor).eos_id(); }
__attribute__((visibility("default"))) int zest_spm_unk_id(const void* processor) { return sp(processor).unk_id(); }

}  // extern "C"
