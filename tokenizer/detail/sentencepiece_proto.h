// The two facts of a SentencePiece model file (a serialized ModelProto, as
// sentencepiece_model.proto defines it) that Hugging Face's conversion
// depends on, read from its wire format without protobuf:
//
//   ModelProto        3: normalizer_spec (NormalizerSpec)
//   NormalizerSpec    1: name (string), 3: add_dummy_prefix (bool, true),
//                     4: remove_extra_whitespaces (bool, true),
//                     5: escape_whitespaces (bool, true)
//
// and the same model with add_dummy_prefix false, as transformers'
// LlamaTokenizer.get_spm_processor makes it (the prefix space is then the
// tokenizer's to add, hf_tokenizer.h's step 2).
#pragma once

#include <string>
#include <string_view>

namespace zest::detail {

struct SentencePieceNormalizer {
  std::string name;  // "identity", "nmt_nfkc", ... ("" when the field is absent)
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
};

// Throws naming `where` for bytes that are not a ModelProto's wire format.
SentencePieceNormalizer read_sentencepiece_normalizer(std::string_view model, const std::string& where);

// `model` with normalizer_spec.add_dummy_prefix false (a field appended to
// the message: protobuf takes the last value of a scalar).
std::string sentencepiece_without_dummy_prefix(std::string_view model, const std::string& where);

}  // namespace zest::detail
