#include "zest/tokenizer/text_jsonl.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <string_view>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/data/jsonl_lines.h"

namespace zest {

namespace {

constexpr const char* kPreTokenized =
    "tokenize them with the model's chat template in Python and give --format jsonl (input_ids, labels) or --format "
    "megatron";

struct Tokenized {
  TokenDocument doc;
  bool mismatched = false;
};

std::string text_field(const nlohmann::json& j, const char* key, const std::string& where) {
  const nlohmann::json& v = j[key];
  if (v.is_array()) {
    ZEST_FAIL("{}: \"{}\" is a list (a conversation), which needs the model's chat template; ZEST does not run chat "
              "templates: {}",
              where, key, kPreTokenized);
  }
  ZEST_CHECK(v.is_string(), "{}: \"{}\" is {}, not a string", where, key, v.dump());
  return v.get<std::string>();
}

Tokenized tokenize_record(std::string_view line, const std::string& where, const HfTokenizer& tok,
                          int64_t vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    ZEST_FAIL("{}: not a JSON object ({}): each line of a text JSONL file is one record", where, e.what());
  }
  ZEST_CHECK(j.is_object(), "{}: a JSON {}, where each line is one record (an object)", where, j.type_name());
  const auto with_eos = [&](std::string s) {
    if (!s.ends_with(tok.eos_token())) s += tok.eos_token();
    return s;
  };
  Tokenized t;
  if (j.contains("prompt")) {
    const std::string prompt = text_field(j, "prompt", where);
    ZEST_CHECK(j.contains("completion"), "{}: a \"prompt\" without a \"completion\": a prompt-completion record has "
               "both (the completion is what is trained on)", where);
    const std::string completion = with_eos(text_field(j, "completion", where));
    const std::vector<int64_t> prompt_ids = tok.encode(prompt);
    t.doc.tokens = tok.encode(prompt + completion);
    const size_t masked = std::min(prompt_ids.size(), t.doc.tokens.size());
    t.mismatched = !std::equal(prompt_ids.begin(), prompt_ids.begin() + static_cast<ptrdiff_t>(masked),
                               t.doc.tokens.begin()) || masked < prompt_ids.size();
    t.doc.labels = t.doc.tokens;
    std::fill(t.doc.labels.begin(), t.doc.labels.begin() + static_cast<ptrdiff_t>(masked), kIgnoreIndex);
  } else if (j.contains("text")) {
    t.doc.tokens = tok.encode(with_eos(text_field(j, "text", where)));
  } else if (j.contains("messages") || j.contains("conversations")) {
    ZEST_FAIL("{}: a conversational record (\"{}\") needs the model's chat template, which ZEST does not run: {}",
              where, j.contains("messages") ? "messages" : "conversations", kPreTokenized);
  } else if (j.contains("input_ids")) {
    ZEST_FAIL("{}: a tokenized record (\"input_ids\") in a text JSONL file: give it as --format jsonl", where);
  } else {
    ZEST_FAIL("{}: a record without \"prompt\" and \"completion\" or \"text\" (TRL's prompt-completion and "
              "language-modeling records): {}",
              where, j.dump().substr(0, 200));
  }
  ZEST_CHECK(!t.doc.tokens.empty(), "{}: the record has no tokens", where);
  const int64_t limit = vocab_size > 0 ? vocab_size : tok.vocab_size();
  for (size_t i = 0; i < t.doc.tokens.size(); ++i) {
    ZEST_CHECK(t.doc.tokens[i] >= 0 && t.doc.tokens[i] < limit,
               "{}: token {} is id {}, outside the model's vocabulary [0, {}): the tokenizer ({}) is not this "
               "model's",
               where, i, t.doc.tokens[i], limit, tok.describe());
  }
  return t;
}

}  // namespace

TextJsonl::TextJsonl(const std::string& path, std::shared_ptr<const HfTokenizer> tokenizer, int64_t vocab_size)
    : path_(path),
      tokenizer_(std::move(tokenizer)),
      vocab_size_(vocab_size),
      file_(path, {.follow_links = true}),
      index_(path) {
  ZEST_CHECK(tokenizer_ != nullptr, "{}: a text JSONL dataset needs a tokenizer", path_);
  int64_t first_mismatch = 0;
  for_each_jsonl_line(file_, path_, [&](const JsonlLine& line) {
    const Tokenized t = tokenize_record(line.text, fmt::format("{}:{}", path_, line.number), *tokenizer_, vocab_size_);
    if (t.mismatched && mismatched_++ == 0) first_mismatch = line.number;
    index_.add(line, static_cast<int64_t>(t.doc.tokens.size()));
  });
  ZEST_CHECK(index_.size() > 0, "{}: no records (an empty file, or blank lines only)", path_);
  if (mismatched_ > 0) {
    ZEST_LOG_WARN("{}: in {} of {} records (the first at line {}) the prompt's tokens are not the start of prompt + "
                  "completion's (the tokenizer merged across the boundary); as TRL, the prompt's count of tokens is "
                  "masked. A completion that starts with a space usually avoids it",
                  path_, mismatched_, index_.size(), first_mismatch);
  }
}

TokenDocument TextJsonl::document(int64_t d) const {
  const std::string where = index_.where(d);
  Tokenized t = tokenize_record(index_.read(file_, d), where, *tokenizer_, vocab_size_);
  ZEST_CHECK(static_cast<int64_t>(t.doc.tokens.size()) == length(d),
             "{}: the record changed since the file was opened ({} tokens, then {})", where, length(d),
             t.doc.tokens.size());
  return std::move(t.doc);
}

}  // namespace zest
