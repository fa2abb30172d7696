#include "zest/data/tokenized_jsonl.h"

#include <algorithm>
#include <limits>
#include <string_view>

#include <nlohmann/json.hpp>

#include "zest/core/check.h"
#include "zest/data/jsonl_lines.h"

namespace zest {

namespace {

// A record's fields, checked: see the header comment.
struct Record {
  std::vector<int64_t> tokens;
  std::vector<int64_t> labels;  // empty: the tokens
};

std::vector<int64_t> int_array(const nlohmann::json& j, const char* key, const std::string& where) {
  ZEST_CHECK(j.is_array(), "{}: \"{}\" is {}, not an array of integers", where, key, j.type_name());
  std::vector<int64_t> out;
  out.reserve(j.size());
  for (size_t i = 0; i < j.size(); ++i) {
    const nlohmann::json& v = j[i];
    ZEST_CHECK(v.is_number_integer(), "{}: \"{}\"[{}] is {}, not an integer", where, key, i, v.dump());
    out.push_back(v.get<int64_t>());
  }
  return out;
}

Record parse_record(std::string_view line, const std::string& where, int64_t vocab_size) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    ZEST_FAIL("{}: not a JSON object ({}): each line of a tokenized JSONL file is one record", where, e.what());
  }
  ZEST_CHECK(j.is_object(), "{}: a JSON {}, where each line is one record (an object)", where, j.type_name());
  if (!j.contains("input_ids")) {
    const bool text = j.contains("text") || j.contains("prompt") || j.contains("completion") || j.contains("messages");
    ZEST_FAIL("{}: the record has no \"input_ids\"{}: give tokenized records (Hugging Face datasets' map with the "
              "model's tokenizer, then to_json) or a Megatron indexed dataset (--format megatron)",
              where, text ? " (it holds text, which this format does not tokenize)" : "");
  }
  Record r;
  r.tokens = int_array(j["input_ids"], "input_ids", where);
  const size_t n = r.tokens.size();
  std::vector<int64_t> mask;
  if (j.contains("labels") && !j["labels"].is_null()) {
    r.labels = int_array(j["labels"], "labels", where);
    ZEST_CHECK(r.labels.size() == n, "{}: {} labels for {} input_ids: they pair up one to one", where,
               r.labels.size(), n);
  }
  if (j.contains("attention_mask") && !j["attention_mask"].is_null()) {
    mask = int_array(j["attention_mask"], "attention_mask", where);
    ZEST_CHECK(mask.size() == n, "{}: an attention_mask of {} for {} input_ids", where, mask.size(), n);
  }
  // Padding (mask 0) at either end is dropped; a 0 between 1s is refused.
  size_t begin = 0, end = n;
  if (!mask.empty()) {
    for (size_t i = 0; i < n; ++i) {
      ZEST_CHECK(mask[i] == 0 || mask[i] == 1, "{}: attention_mask[{}] is {}, not 0 or 1", where, i, mask[i]);
    }
    while (begin < end && mask[begin] == 0) ++begin;
    while (end > begin && mask[end - 1] == 0) --end;
    for (size_t i = begin; i < end; ++i) {
      ZEST_CHECK(mask[i] == 1,
                 "{}: attention_mask[{}] is 0 between 1s: only padding at the start or the end of a record is "
                 "dropped, and a masked token inside it would make the record two sequences",
                 where, i);
    }
  }
  r.tokens = std::vector<int64_t>(r.tokens.begin() + static_cast<ptrdiff_t>(begin),
                                  r.tokens.begin() + static_cast<ptrdiff_t>(end));
  if (!r.labels.empty()) {
    r.labels = std::vector<int64_t>(r.labels.begin() + static_cast<ptrdiff_t>(begin),
                                    r.labels.begin() + static_cast<ptrdiff_t>(end));
  }
  ZEST_CHECK(!r.tokens.empty(), "{}: no input_ids{}", where, mask.empty() ? "" : " outside the padding");
  const int64_t limit = vocab_size > 0 ? vocab_size : std::numeric_limits<int64_t>::max();
  for (size_t i = 0; i < r.tokens.size(); ++i) {
    ZEST_CHECK(r.tokens[i] >= 0 && r.tokens[i] < limit,
               "{}: input_ids[{}] is {}, outside the model's vocabulary [0, {}): the data was tokenized for another "
               "model",
               where, begin + i, r.tokens[i], limit);
  }
  for (size_t i = 0; i < r.labels.size(); ++i) {
    ZEST_CHECK(r.labels[i] == kIgnoreIndex || (r.labels[i] >= 0 && r.labels[i] < limit),
               "{}: labels[{}] is {}: a label is a token id of the vocabulary [0, {}) or -100 (not trained on)",
               where, begin + i, r.labels[i], limit);
  }
  return r;
}

}  // namespace

TokenizedJsonl::TokenizedJsonl(const std::string& path, int64_t vocab_size)
    : path_(path), vocab_size_(vocab_size), file_(path, {.follow_links = true}), index_(path) {
  // One pass: each line's offset and length, its record checked.
  for_each_jsonl_line(file_, path_, [&](const JsonlLine& line) {
    const Record r = parse_record(line.text, fmt::format("{}:{}", path_, line.number), vocab_size_);
    index_.add(line, static_cast<int64_t>(r.tokens.size()));
  });
  ZEST_CHECK(index_.size() > 0, "{}: no records (an empty file, or blank lines only)", path_);
}

TokenDocument TokenizedJsonl::document(int64_t d) const {
  const std::string where = index_.where(d);
  Record r = parse_record(index_.read(file_, d), where, vocab_size_);
  ZEST_CHECK(static_cast<int64_t>(r.tokens.size()) == length(d),
             "{}: the record changed since the file was opened ({} tokens, then {})", where, length(d), r.tokens.size());
  return {std::move(r.tokens), std::move(r.labels)};
}

}  // namespace zest
