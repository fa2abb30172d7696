// How config_json.cpp reads a DeepSpeed file: one Section per JSON object,
// which remembers the keys it was asked about, so that every other key is
// found; problems are collected, not thrown, so that one error can list
// them all. Internal (not installed).
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "zest/config/config.h"

namespace zest::config_detail {

using nlohmann::json;

// One file's reading: the program's values for "auto", the config being
// filled, and the problems found so far.
//
// Both lists are capped: a hostile file of 100,000 unknown keys makes an
// error, and a log line, of the first ones and a count, not of megabytes.
struct FileState {
  static constexpr size_t kMaxProblems = 50;
  static constexpr size_t kMaxIgnored = 200;

  const AutoValues& program;
  EngineConfig& out;
  std::vector<std::string> problems;
  size_t unlisted_problems = 0, unlisted_ignored = 0;

  bool problems_full() const { return problems.size() >= kMaxProblems; }
  bool ignored_full() const { return out.ignored.size() >= kMaxIgnored; }
  void problem(std::string text) {
    if (problems.size() < kMaxProblems) {
      problems.push_back(std::move(text));
    } else {
      ++unlisted_problems;
    }
  }
  void ignored(std::string key, std::string reason) {
    if (out.ignored.size() < kMaxIgnored) {
      out.ignored.push_back({std::move(key), std::move(reason)});
    } else {
      ++unlisted_ignored;
    }
  }
  void filled(std::string key, std::string how) { out.auto_filled.push_back({std::move(key), std::move(how)}); }
  void mismatch(std::string key, std::string text) { out.mismatched.push_back({std::move(key), std::move(text)}); }
  void warn(std::string key, std::string text) { out.warnings.push_back({std::move(key), std::move(text)}); }
};

// How a value written "auto" is filled, after Hugging Face's Trainer
// (transformers' HfTrainerDeepSpeedConfig): by the program's value when it
// supplied one; otherwise by the key's default (DeepSpeed's, which is what
// DeepSpeed's own config models do with an "auto" nobody filled), unless
// the key has none. A written value that differs from a supplied program
// value is noted (Hugging Face's "mismatch"), unless must_match is off.
template <typename T>
struct AutoRule {
  AutoRule(std::optional<T> program_value, const char* program_field, std::string how_text = {},
           bool must_match_program = true, bool has_a_default = true)
      : program(std::move(program_value)), field(program_field), how(std::move(how_text)),
        must_match(must_match_program), has_default(has_a_default) {}

  std::optional<T> program;
  const char* field = "";   // the AutoValues member that fills it
  std::string how;          // how the program value becomes this one, for the note
  bool must_match = true;
  bool has_default = true;  // false: "auto" needs the program's value
};

// What a key that is not one of the section's means.
enum class Unknown {
  // DeepSpeed validates the section (a pydantic model, or keyword arguments
  // of a constructor): an unknown key is refused, as DeepSpeed refuses it.
  kRefuse,
  // DeepSpeed reads the section with dict lookups and never sees other
  // keys: they are ignored (and noted); a near miss of a known key, far
  // more likely a typo than a key of another tool, is skipped with a warning.
  kIgnoreUnlessTypo,
};

class Section {
 public:
  Section(FileState& file, const json& j, std::string path, Unknown unknown);

  // Marks `key` as known; the value, or nullptr when absent or null.
  const json* get(const char* key);
  // Of two names for one setting (an alias or a deprecated name), the one
  // present (both: a problem); nullptr when neither is.
  const char* either(const char* name, const char* other_name);

  // Each read leaves `out` unchanged when the key is absent or its value is
  // bad (a problem is recorded); returns whether `out` was set.
  bool read_bool(const char* key, bool& out, const AutoRule<bool>* rule = nullptr);
  bool read_bool(const char* key, std::optional<bool>& out, const AutoRule<bool>* rule = nullptr);
  bool read_int(const char* key, int64_t& out, int64_t lo, int64_t hi, const AutoRule<int64_t>* rule = nullptr);
  bool read_int(const char* key, int& out, int lo, int hi, const AutoRule<int64_t>* rule = nullptr);
  bool read_int(const char* key, std::optional<int64_t>& out, int64_t lo, int64_t hi,
                const AutoRule<int64_t>* rule = nullptr);
  bool read_double(const char* key, double& out, double lo, double hi, const AutoRule<double>* rule = nullptr);
  bool read_float(const char* key, float& out, double lo, double hi, const AutoRule<double>* rule = nullptr);
  // One of `allowed`, compared without case; its index, or -1.
  int read_choice(const char* key, const std::vector<std::string>& allowed);

  // A nested object, read by its own Section; nullopt when absent (or not
  // an object: a problem).
  std::optional<Section> sub(const char* key, Unknown unknown);

  // A key whose setting ZEST does not act on, because it concerns what ZEST
  // does not do: accepted, and noted as ignored with `reason`.
  void ignore(const char* key, const std::string& reason);
  // A key that asks for a feature ZEST does not have when `asks(value)`:
  // a problem naming the feature; otherwise ignored with `reason`.
  template <typename Pred>
  void refuse_if(const char* key, Pred asks, const std::string& feature, const std::string& reason);
  // A problem about `key` (its path is prefixed).
  void problem(const char* key, const std::string& text);
  void feature_problem(const char* key, const json& v, const std::string& feature);

  std::string where(const char* key) const;
  const std::string& path() const { return path_; }
  const json& value() const { return j_; }

  // Every key of the section must have been asked about (see Unknown).
  void finish();

  // Note [pydantic's coercion]. DeepSpeed validates zero_optimization (and
  // its offload sections), fp16 and bf16 with pydantic models in lax mode,
  // which convert what a JSON value can mean: "3" or " 3 " to 3 for a whole
  // number, "1e-5" to 1e-5 for a number, and for a flag "true"/"false",
  // "yes"/"no", "on"/"off", "t"/"f", "y"/"n", "1"/"0" (any case) and the
  // numbers 1 and 0. The sections it reads with dict lookups (the top level,
  // optimizer and scheduler params) pass a string on as it is, and
  // DeepSpeed or torch then fails on it; there it stays an error. On, the
  // reads of this section (and of its sub-sections) convert as pydantic does.
  void coerce_like_pydantic() { lax_ = true; }

 private:
  bool is_auto(const char* key, const json& v) const;
  template <typename T>
  bool take_auto(const char* key, const AutoRule<T>* rule, T& value, const std::string& shown_default);
  template <typename T>
  void check_match(const char* key, const AutoRule<T>* rule, const T& written);
  bool whole(const char* key, const json& v, int64_t& out);
  // The value a read sees: `v`, or with coerce_like_pydantic what pydantic
  // makes of it (`kind` 'b' a flag, 'i' a whole number, 'd' a number).
  const json& coerced(const json& v, char kind);

  FileState* file_;
  const json& j_;
  std::string path_;
  Unknown unknown_;
  bool lax_ = false;
  json converted_;  // the last coerced value
  std::vector<std::string> known_;
};

template <typename Pred>
void Section::refuse_if(const char* key, Pred asks, const std::string& feature, const std::string& reason) {
  const json* v = get(key);
  if (!v) return;
  if (asks(*v)) {
    feature_problem(key, *v, feature);
  } else {
    file_->ignored(where(key), reason);
  }
}

// The closest of `candidates` to `word` when it is close enough to be a
// typo of it (edit distance at most a third of its length, at least 1).
std::optional<std::string> did_you_mean(const std::string& word, const std::vector<std::string>& candidates);

// A JSON value counts as "on" (a feature asked for) when it is true, a
// non-zero number, a non-empty string other than "none"/"false", or an
// object whose "enabled" is on.
bool is_on(const json& v);

// `s` in lower case (ASCII): the case-insensitive names of the config.
std::string lower(std::string s);

}  // namespace zest::config_detail
