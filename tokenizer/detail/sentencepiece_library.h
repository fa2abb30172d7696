// A SentencePiece model reached through the zest_sentencepiece module
// (sentencepiece_shim.h says why a module): opened once, the first time a
// model is loaded, from $ZEST_SENTENCEPIECE_MODULE, else the build tree's,
// else the installed one; never closed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace zest::detail {

class SentencePieceModel {
 public:
  // `serialized`: a ModelProto's bytes; `where` names it in errors.
  SentencePieceModel(std::string_view serialized, const std::string& where);
  ~SentencePieceModel();
  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // Appends the ids of `text` to `out`. Safe from several threads.
  void encode(std::string_view text, std::vector<int64_t>& out) const;
  int64_t pieces() const;
  // -1 when `piece` is not one of the model's.
  int64_t piece_to_id(std::string_view piece) const;
  // "" outside the model.
  std::string id_to_piece(int64_t id) const;
  int64_t bos_id() const;
  int64_t eos_id() const;
  int64_t unk_id() const;

 private:
  void* processor_ = nullptr;
  std::string where_;
};

}  // namespace zest::detail
