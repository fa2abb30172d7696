#include "zest/tokenizer/hf_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "zest/core/check.h"
#include "zest/core/file_io.h"
#include "zest/tokenizer/detail/sentencepiece_proto.h"
#include "zest_generated/build_config.h"

#if ZEST_WITH_SENTENCEPIECE
#include "zest/tokenizer/detail/sentencepiece_library.h"
#endif

namespace zest {

namespace fs = std::filesystem;

bool has_sentencepiece() { return ZEST_WITH_SENTENCEPIECE != 0; }

namespace hf_tokenizer_impl {

// Where the space before a piece of text comes from (hf_tokenizer.h, step
// 2): tokenizers' Prepend normalizer (legacy: before every non-empty piece,
// before the added tokens it holds are split out), or its Metaspace
// pre-tokenizer (kAlways: before each piece not starting with a space,
// kFirst: only the piece at the start of the text), or nowhere.
enum class Prefix { kLegacy, kAlways, kFirst, kNever };

constexpr std::string_view kMetaSpace = "\xe2\x96\x81";  // "▁", SentencePiece's space

const char* prefix_name(Prefix p) {
  switch (p) {
    case Prefix::kLegacy: return "legacy (a space before every piece)";
    case Prefix::kAlways: return "Metaspace always";
    case Prefix::kFirst: return "Metaspace first";
    case Prefix::kNever: return "no prefix space";
  }
  return "?";
}

struct AddedToken {
  std::string content;
  int64_t id = 0;
  bool lstrip = false, rstrip = false, normalized = false;
};

// A token's text: a string, or an AddedToken object ({"content": ...}).
std::string token_text(const nlohmann::json& v, const std::string& where, const char* key) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  ZEST_FAIL("{}: \"{}\" is {}, not a token (a string or an object with \"content\")", where, key, v.dump());
}

bool flag(const nlohmann::json& j, const char* key, bool fallback, const std::string& where) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  ZEST_CHECK(j[key].is_boolean(), "{}: \"{}\" is {}, not true or false", where, key, j[key].dump());
  return j[key].get<bool>();
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

nlohmann::json read_json(const fs::path& p) {
  try {
    return nlohmann::json::parse(read_text_file(p.string()));
  } catch (const nlohmann::json::exception& e) {
    ZEST_FAIL("{}: not JSON ({})", p.string(), e.what());
  }
}

// The layout of step 2 from tokenizer.json's normalizer and pre_tokenizer,
// refusing a shape LlamaConverter does not write.
Prefix layout_of_tokenizer_json(const nlohmann::json& t, const std::string& where) {
  const std::string kSpace(kMetaSpace);
  const nlohmann::json norm = t.value("normalizer", nlohmann::json());
  const nlohmann::json pre = t.value("pre_tokenizer", nlohmann::json());
  bool prepend = false, replace = false;
  if (!norm.is_null()) {
    std::vector<nlohmann::json> steps;
    if (norm.value("type", "") == "Sequence" && norm.contains("normalizers")) {
      for (const auto& s : norm["normalizers"]) steps.push_back(s);
    } else {
      steps.push_back(norm);
    }
    for (const auto& s : steps) {
      const std::string type = s.value("type", "");
      if (type == "Prepend" && s.value("prepend", "") == kSpace) {
        prepend = true;
      } else if (type == "Replace" && s.contains("pattern") && s["pattern"].value("String", "") == " " &&
                 s.value("content", "") == kSpace) {
        replace = true;
      } else {
        ZEST_FAIL("{}: normalizer step {}: ZEST encodes with tokenizer.model as Hugging Face's LlamaConverter "
                  "lays it out (Prepend \"\u2581\" and Replace \" \", or none); pre-tokenize the data with this "
                  "tokenizer instead (--format jsonl or megatron)",
                  where, s.dump());
      }
    }
  }
  if (pre.is_null()) {
    ZEST_CHECK(norm.is_null() || replace, "{}: a normalizer without Replace \" \" -> \"\u2581\" and no pre_tokenizer: "
               "not a SentencePiece layout ZEST reproduces; pre-tokenize the data instead", where);
    return prepend ? Prefix::kLegacy : Prefix::kNever;
  }
  ZEST_CHECK(pre.value("type", "") == "Metaspace" && pre.value("replacement", "") == kSpace,
             "{}: pre_tokenizer {}: ZEST reproduces a Metaspace \"\u2581\" pre-tokenizer (LlamaConverter's, "
             "legacy false) or none; pre-tokenize the data with this tokenizer instead (--format jsonl or megatron)",
             where, pre.dump());
  ZEST_CHECK(!pre.value("split", true),
             "{}: a Metaspace pre-tokenizer with \"split\": true (one BPE word per space) is not how tokenizer.model "
             "encodes; pre-tokenize the data with this tokenizer instead (--format jsonl or megatron)",
             where);
  ZEST_CHECK(!prepend, "{}: both a Prepend normalizer and a Metaspace pre-tokenizer: pre-tokenize the data instead",
             where);
  const std::string scheme = pre.value("prepend_scheme", pre.value("add_prefix_space", true) ? "always" : "never");
  if (scheme == "first") return Prefix::kFirst;
  if (scheme == "always") return Prefix::kAlways;
  if (scheme == "never") return Prefix::kNever;
  ZEST_FAIL("{}: Metaspace prepend_scheme \"{}\": first, always or never", where, scheme);
}

// Added tokens by their first byte, each list longest first.
struct AddedTokens {
  std::array<std::vector<AddedToken>, 256> by_first;
  size_t count = 0;

  void add(const AddedToken& t) {
    auto& list = by_first[static_cast<unsigned char>(t.content.front())];
    const auto longer = [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); };
    list.insert(std::upper_bound(list.begin(), list.end(), t, longer), t);
    ++count;
  }
};

}  // namespace hf_tokenizer_impl

struct HfTokenizer::Impl {
  using Prefix = hf_tokenizer_impl::Prefix;
  using AddedToken = hf_tokenizer_impl::AddedToken;

  std::string model_path;
  std::string layout_from;  // the file that decided the layout
  Prefix prefix = Prefix::kLegacy;
  bool add_bos = true, add_eos = false;
  int64_t bos = 1, eos = 2, vocab = 0, pieces = 0;
  std::string bos_text = "<s>", eos_text = "</s>";
  // Matched on the raw text, then on each piece after the legacy prefix
  // (tokenizers' AddedVocabulary: normalized false, then true); each
  // longest first.
  hf_tokenizer_impl::AddedTokens raw, normalized;
#if ZEST_WITH_SENTENCEPIECE
  std::unique_ptr<detail::SentencePieceModel> sp;
#endif

  void encode_piece(std::string_view text, std::vector<int64_t>& out) const;
  void encode_text(std::string_view text, size_t offset, std::vector<int64_t>& out) const;
};

namespace hf_tokenizer_impl {

struct Match {
  size_t begin = 0, end = 0;  // the bytes taken, stripped whitespace included
  const AddedToken* token = nullptr;
};

// The leftmost-longest added token in text[from, ...): tokenizers'
// aho-corasick with MatchKind::LeftmostLongest.
bool find_added(const AddedTokens& tokens, std::string_view text, size_t from, Match& m) {
  if (tokens.count == 0) return false;
  for (size_t i = from; i < text.size(); ++i) {
    for (const AddedToken& t : tokens.by_first[static_cast<unsigned char>(text[i])]) {
      if (text.compare(i, t.content.size(), t.content) != 0) continue;
      m.token = &t;
      m.begin = i;
      m.end = i + t.content.size();
      if (t.lstrip) {
        while (m.begin > from && is_space(text[m.begin - 1])) --m.begin;
      }
      if (t.rstrip) {
        while (m.end < text.size() && is_space(text[m.end])) ++m.end;
      }
      return true;
    }
  }
  return false;
}

}  // namespace hf_tokenizer_impl

void HfTokenizer::Impl::encode_piece(std::string_view text, std::vector<int64_t>& out) const {
  if (text.empty()) return;
#if ZEST_WITH_SENTENCEPIECE
  sp->encode(text, out);
#else
  (void)out;
#endif
}

// A piece between raw added tokens, starting at byte `offset` of the text:
// the legacy prefix, the normalized added tokens, Metaspace's prefix.
void HfTokenizer::Impl::encode_text(std::string_view text, size_t offset, std::vector<int64_t>& out) const {
  using namespace hf_tokenizer_impl;
  std::string norm;
  if (prefix == Prefix::kLegacy && !text.empty()) {
    norm = " ";
    norm += text;
    text = norm;
  }
  size_t at = 0;
  const auto plain = [&](size_t begin, size_t end) {
    std::string_view piece = text.substr(begin, end - begin);
    if (piece.empty()) return;
    const bool spaced = piece.front() == ' ' || piece.starts_with(kMetaSpace);
    if ((prefix == Prefix::kAlways || (prefix == Prefix::kFirst && offset + begin == 0)) && !spaced) {
      encode_piece(" " + std::string(piece), out);
    } else {
      encode_piece(piece, out);
    }
  };
  Match m;
  while (find_added(normalized, text, at, m)) {
    plain(at, m.begin);
    out.push_back(m.token->id);
    at = m.end;
  }
  plain(at, text.size());
}

HfTokenizer::HfTokenizer(const std::string& path) : impl_(std::make_unique<Impl>()) {
  using namespace hf_tokenizer_impl;
  Impl& t = *impl_;
  std::error_code ec;
  fs::path dir = path, model = path;
  if (fs::is_directory(path, ec)) {
    model = dir / "tokenizer.model";
  } else {
    dir = fs::path(path).parent_path();
    if (dir.empty()) dir = ".";
  }
  const fs::path config_path = dir / "tokenizer_config.json", json_path = dir / "tokenizer.json";
  if (!fs::exists(model, ec)) {
    ZEST_CHECK(!fs::exists(json_path, ec),
               "{}: the tokenizer is tokenizer.json without a tokenizer.model (a byte-level BPE: Llama 3, Qwen and "
               "others), which ZEST cannot run: no maintained C or C++ library for it is packaged by Debian. Tokenize "
               "the data with the model's tokenizer in Python and give the result as --format jsonl (Hugging Face "
               "datasets' map then to_json: input_ids, labels) or --format megatron (Megatron-LM's "
               "tools/preprocess_data.py)",
               dir.string());
    ZEST_FAIL("{}: no tokenizer.model (a SentencePiece model, as Llama 2 and Mistral checkpoints ship it): give the "
              "checkpoint directory that holds it, or pre-tokenized data (--format jsonl or megatron)",
              model.string());
  }
  t.model_path = model.string();
  ZEST_CHECK(has_sentencepiece(),
             "{}: this build of ZEST has no SentencePiece: install libsentencepiece-dev (scripts/setup.sh does) and "
             "rebuild, or pre-tokenize the data (--format jsonl or megatron)",
             t.model_path);
  const std::string bytes = read_text_file(t.model_path);
  const detail::SentencePieceNormalizer n = detail::read_sentencepiece_normalizer(bytes, t.model_path);
  ZEST_CHECK(n.name == "identity" && !n.remove_extra_whitespaces && n.escape_whitespaces,
             "{}: a SentencePiece normalizer '{}' (remove_extra_whitespaces {}, escape_whitespaces {}): Hugging Face's "
             "LlamaTokenizer ignores it where SentencePiece applies it, so the ids would differ; ZEST encodes with the "
             "'identity' normalizer of Llama and Mistral only. Pre-tokenize the data (--format jsonl or megatron)",
             t.model_path, n.name, n.remove_extra_whitespaces, n.escape_whitespaces);
#if ZEST_WITH_SENTENCEPIECE
  const std::string bare = detail::sentencepiece_without_dummy_prefix(bytes, t.model_path);
  t.sp = std::make_unique<detail::SentencePieceModel>(bare, t.model_path);
  t.pieces = t.sp->pieces();
  const auto piece_id = [&](const std::string& piece) { return t.sp->piece_to_id(piece); };
  const auto model_piece = [&](int64_t id, const char* fallback) {
    const std::string piece = t.sp->id_to_piece(id);
    return piece.empty() ? std::string(fallback) : piece;
  };
  t.bos_text = model_piece(t.sp->bos_id(), "<s>");
  t.eos_text = model_piece(t.sp->eos_id(), "</s>");
  std::string unk_text = model_piece(t.sp->unk_id(), "<unk>");
#else
  const auto piece_id = [](const std::string&) -> int64_t { return -1; };
  std::string unk_text = "<unk>";
#endif

  // tokenizer_config.json: the class, the special tokens and their flags.
  nlohmann::json config = nlohmann::json::object();
  const std::string cwhere = config_path.string();
  if (fs::exists(config_path, ec)) config = read_json(config_path);
  ZEST_CHECK(config.is_object(), "{}: a JSON {}, not an object", cwhere, config.type_name());
  ZEST_CHECK(!config.contains("tokenizer_class") || config["tokenizer_class"].is_string(),
             "{}: \"tokenizer_class\" is {}, not a class name", cwhere, config.value("tokenizer_class", nlohmann::json()).dump());
  const std::string cls = config.value("tokenizer_class", "LlamaTokenizer");
  ZEST_CHECK(cls == "LlamaTokenizer" || cls == "LlamaTokenizerFast",
             "{}: tokenizer_class \"{}\": ZEST runs tokenizer.model as LlamaTokenizer(Fast) does (Llama 1/2, "
             "Mistral); another class encodes differently. Pre-tokenize the data (--format jsonl or megatron)",
             cwhere, cls);
  if (config.contains("bos_token") && !config["bos_token"].is_null())
    t.bos_text = token_text(config["bos_token"], cwhere, "bos_token");
  if (config.contains("eos_token") && !config["eos_token"].is_null())
    t.eos_text = token_text(config["eos_token"], cwhere, "eos_token");
  if (config.contains("unk_token") && !config["unk_token"].is_null())
    unk_text = token_text(config["unk_token"], cwhere, "unk_token");
  t.add_bos = flag(config, "add_bos_token", true, cwhere);
  t.add_eos = flag(config, "add_eos_token", false, cwhere);
  const bool legacy = flag(config, "legacy", true, cwhere);
  const bool add_prefix_space = flag(config, "add_prefix_space", true, cwhere);
  t.prefix = legacy ? (add_prefix_space ? Prefix::kLegacy : Prefix::kNever)
                    : (add_prefix_space ? Prefix::kFirst : Prefix::kNever);
  t.layout_from = fs::exists(config_path, ec) ? cwhere : "transformers' defaults";

  // The added tokens: tokenizer_config.json's, else tokenizer.json's, else
  // the model's special pieces as LlamaTokenizer adds them.
  std::vector<AddedToken> added;
  nlohmann::json tokenizer_json;
  if (fs::exists(json_path, ec)) {
    tokenizer_json = read_json(json_path);
    t.prefix = layout_of_tokenizer_json(tokenizer_json, json_path.string());
    t.layout_from = json_path.string();
  }
  const auto read_added = [&](const nlohmann::json& v, int64_t id, const std::string& where) {
    ZEST_CHECK(v.is_object() && v.contains("content") && v["content"].is_string(),
               "{}: added token {} is {}, not an object with \"content\"", where, id, v.dump());
    ZEST_CHECK(id >= 0, "{}: added token \"{}\" has id {}", where, v["content"].get<std::string>(), id);
    AddedToken a;
    a.content = v["content"].get<std::string>();
    a.id = id;
    a.lstrip = flag(v, "lstrip", false, where);
    a.rstrip = flag(v, "rstrip", false, where);
    a.normalized = flag(v, "normalized", !flag(v, "special", false, where), where);
    ZEST_CHECK(!flag(v, "single_word", false, where),
               "{}: added token \"{}\" is single_word (matched only as a whole word): not reproduced; pre-tokenize "
               "the data (--format jsonl or megatron)",
               where, a.content);
    ZEST_CHECK(!a.content.empty(), "{}: added token {} is empty", where, id);
    added.push_back(std::move(a));
  };
  if (config.contains("added_tokens_decoder") && config["added_tokens_decoder"].is_object()) {
    for (const auto& [key, v] : config["added_tokens_decoder"].items()) {
      int64_t id = -1;
      try {
        id = std::stoll(key);
      } catch (const std::exception&) {
        ZEST_FAIL("{}: added_tokens_decoder key \"{}\" is not a token id", cwhere, key);
      }
      read_added(v, id, cwhere);
    }
  } else if (tokenizer_json.is_object() && tokenizer_json.contains("added_tokens")) {
    for (const auto& v : tokenizer_json["added_tokens"]) {
      ZEST_CHECK(v.is_object() && v.contains("id") && v["id"].is_number_integer(),
                 "{}: an added token without an integer \"id\": {}", json_path.string(), v.dump());
      read_added(v, v["id"].get<int64_t>(), json_path.string());
    }
  } else {
    for (const std::string& s : {unk_text, t.bos_text, t.eos_text}) {
      const int64_t id = piece_id(s);
      if (id >= 0) added.push_back({s, id, false, false, false});
    }
  }
  const auto id_of = [&](const std::string& text, const char* key) {
    for (const AddedToken& a : added) {
      if (a.content == text) return a.id;
    }
    const int64_t id = piece_id(text);
    ZEST_CHECK(id >= 0, "{}: {} \"{}\" is neither an added token nor a piece of {}", cwhere, key, text,
               t.model_path);
    return id;
  };
  t.bos = id_of(t.bos_text, "bos_token");
  t.eos = id_of(t.eos_text, "eos_token");
  t.vocab = t.pieces;
  for (const AddedToken& a : added) t.vocab = std::max(t.vocab, a.id + 1);
  for (const AddedToken& a : added) (a.normalized && t.prefix == Prefix::kLegacy ? t.normalized : t.raw).add(a);
}

HfTokenizer::~HfTokenizer() = default;
HfTokenizer::HfTokenizer(HfTokenizer&&) noexcept = default;
HfTokenizer& HfTokenizer::operator=(HfTokenizer&&) noexcept = default;

std::vector<int64_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  using namespace hf_tokenizer_impl;
  const Impl& t = *impl_;
  std::vector<int64_t> out;
  if (add_special_tokens && t.add_bos) out.push_back(t.bos);
  size_t at = 0;
  Match m;
  while (find_added(t.raw, text, at, m)) {
    t.encode_text(text.substr(at, m.begin - at), at, out);
    out.push_back(m.token->id);
    at = m.end;
  }
  t.encode_text(text.substr(at), at, out);
  if (add_special_tokens && t.add_eos) out.push_back(t.eos);
  return out;
}

int64_t HfTokenizer::vocab_size() const { return impl_->vocab; }
int64_t HfTokenizer::bos_id() const { return impl_->bos; }
int64_t HfTokenizer::eos_id() const { return impl_->eos; }
const std::string& HfTokenizer::eos_token() const { return impl_->eos_text; }

std::string HfTokenizer::describe() const {
  using namespace hf_tokenizer_impl;
  const Impl& t = *impl_;
  return fmt::format("{}: SentencePiece, {} pieces + {} added tokens, {} (from {}), bos {}{} eos {}{}", t.model_path,
                     t.pieces, t.raw.count + t.normalized.count, prefix_name(t.prefix), t.layout_from, t.bos,
                     t.add_bos ? " added" : "", t.eos, t.add_eos ? " added" : "");
}

}  // namespace zest
