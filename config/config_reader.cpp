// Section: reading one JSON object of a DeepSpeed file, with "auto" filled
// after Hugging Face's rules and every problem collected.
#include "zest/config/detail/config_reader.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "zest/config/ds_schema_keys.h"
#include "zest/config/detail/json_parse.h"

namespace zest::config_detail {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string s;
  for (size_t i = 0; i < items.size(); ++i) s += (i ? ", " : "") + items[i];
  return s;
}

std::string show(bool v) { return v ? "true" : "false"; }
std::string show(int64_t v) { return fmt::format("{}", v); }
std::string show(double v) { return fmt::format("{}", v); }

// Optimal string alignment distance: edits, with a swap of two neighbours
// counting as one (the commonest typo).
size_t edit_distance(const std::string& a, const std::string& b) {
  // One flat table (three rows would do; keys are short).
  const size_t n = a.size(), m = b.size(), w = m + 1;
  std::vector<size_t> d((n + 1) * w);
  for (size_t i = 0; i <= n; ++i) d[i * w] = i;
  for (size_t j = 0; j <= m; ++j) d[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      size_t v = std::min({d[(i - 1) * w + j] + 1, d[i * w + j - 1] + 1, d[(i - 1) * w + j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) v = std::min(v, d[(i - 2) * w + j - 2] + 1);
      d[i * w + j] = v;
    }
  }
  return d[n * w + m];
}

// Whether DeepSpeed's schema (ds_schema_keys.h) has `key` in `section`.
bool deepspeed_reads(const std::string& section, const std::string& key) {
  for (const DsSchemaSection& s : kDeepSpeedSchema) {
    if (section != s.path) continue;
    for (const char* k : s.keys)
      if (key == k) return true;
  }
  return false;
}

}  // namespace

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::optional<std::string> did_you_mean(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.size() > 200) return std::nullopt;  // no typo is that long; keeps the table small
  std::optional<std::string> best;
  size_t best_d = 0;
  const std::string w = lower(word);
  for (const std::string& c : candidates) {
    const size_t limit = std::max<size_t>(1, std::min(word.size(), c.size()) / 3);
    // The distance is at least the difference in length: most candidates
    // are ruled out without a table (a file of 100,000 unknown keys runs
    // this 100,000 times).
    if (std::max(word.size(), c.size()) - std::min(word.size(), c.size()) > limit) continue;
    const size_t d = edit_distance(w, lower(c));
    if (d <= limit && (!best || d < best_d)) {
      best = c;
      best_d = d;
    }
  }
  return best;
}

bool is_on(const json& v) {
  if (v.is_boolean()) return v.get<bool>();
  if (v.is_number()) return v.get<double>() != 0.0;
  if (v.is_string()) {
    const std::string s = lower(v.get<std::string>());
    return !(s.empty() || s == "none" || s == "false" || s == "auto");
  }
  if (v.is_object()) return v.contains("enabled") ? is_on(v.at("enabled")) : !v.empty();
  if (v.is_array()) return !v.empty();
  return false;
}

Section::Section(FileState& file, const json& j, std::string path, Unknown unknown)
    : file_(&file), j_(j), path_(std::move(path)), unknown_(unknown) {}

std::string Section::where(const char* key) const { return path_.empty() ? key : path_ + "." + key; }

void Section::problem(const char* key, const std::string& text) { file_->problem(where(key) + " " + text); }

void Section::feature_problem(const char* key, const json& v, const std::string& feature) {
  file_->problem(fmt::format("{} is {}: that asks for {}, which ZEST does not have (remove the key, or turn it "
                             "off, to train without it)",
                             where(key), detail::json_brief(v), feature));
}

const json* Section::get(const char* key) {
  known_.emplace_back(key);
  if (!j_.is_object()) return nullptr;
  const auto it = j_.find(key);
  return it == j_.end() || it->is_null() ? nullptr : &*it;
}

const char* Section::either(const char* name, const char* other_name) {
  const bool a = get(name) != nullptr, b = get(other_name) != nullptr;
  if (a && b) {
    problem(name, fmt::format("and {} are two names for one setting: write only one", where(other_name)));
    return nullptr;
  }
  return a ? name : b ? other_name : nullptr;
}

bool Section::is_auto(const char*, const json& v) const {
  return v.is_string() && v.get_ref<const std::string&>() == "auto";
}

template <typename T>
bool Section::take_auto(const char* key, const AutoRule<T>* rule, T& value, const std::string& shown_default) {
  if (rule && rule->program) {
    value = *rule->program;
    file_->filled(where(key), fmt::format("{} (from AutoValues::{}{})", show(value), rule->field,
                                          rule->how.empty() ? "" : ", " + rule->how));
    return true;
  }
  if (rule && !rule->has_default) {
    problem(key, fmt::format("is \"auto\" and has no default: set AutoValues::{} (or write a value)", rule->field));
    return false;
  }
  file_->filled(where(key), fmt::format("{} (the default{})", shown_default,
                                        rule ? fmt::format("; set AutoValues::{} to choose it", rule->field) : ""));
  return false;
}

template <typename T>
void Section::check_match(const char* key, const AutoRule<T>* rule, const T& written) {
  if (!rule || !rule->program || !rule->must_match || written == *rule->program) return;
  file_->mismatch(where(key), fmt::format("{} in the file, {} from AutoValues::{}: the file's value is used (write "
                                          "\"auto\" to take the program's)",
                                          show(written), show(*rule->program), rule->field));
}

const json& Section::coerced(const json& v, char kind) {
  if (!lax_) return v;
  if (kind == 'b' && v.is_number_integer() && (v.get<int64_t>() == 0 || v.get<int64_t>() == 1)) {
    converted_ = v.get<int64_t>() == 1;
    return converted_;
  }
  if (!v.is_string() || is_auto("", v)) return v;
  converted_ = nullptr;
  const std::string& s = v.get_ref<const std::string&>();
  const size_t a = s.find_first_not_of(" \t\n\r"), b = s.find_last_not_of(" \t\n\r");
  const std::string text = a == std::string::npos ? "" : s.substr(a, b - a + 1);
  if (kind == 'b') {
    const std::string t = lower(text);
    for (const char* yes : {"true", "yes", "on", "t", "y", "1"}) {
      if (t == yes) converted_ = true;
    }
    for (const char* no : {"false", "no", "off", "f", "n", "0"}) {
      if (t == no) converted_ = false;
    }
    if (!converted_.is_boolean()) return v;
    return converted_;
  }
  if (text.empty() || text.size() > 64) return v;
  char* end = nullptr;
  if (kind == 'i') {
    errno = 0;
    const long long x = std::strtoll(text.c_str(), &end, 10);
    if (*end != '\0' || errno == ERANGE || !(std::isdigit(static_cast<unsigned char>(text.back())))) return v;
    converted_ = static_cast<int64_t>(x);
    return converted_;
  }
  // strtod also reads hex floats ("0x1p3"), which pydantic does not.
  if (text.find_first_of("xX") != std::string::npos) return v;
  const double x = std::strtod(text.c_str(), &end);
  if (*end != '\0') return v;
  converted_ = x;
  return converted_;
}

bool Section::read_bool(const char* key, bool& out, const AutoRule<bool>* rule) {
  const json* got = get(key);
  if (!got) return false;
  const json* v = &coerced(*got, 'b');
  if (is_auto(key, *v)) return take_auto(key, rule, out, show(out));
  if (!v->is_boolean()) {
    problem(key, fmt::format("must be true or false, got {}", detail::json_brief(*v)));
    return false;
  }
  check_match(key, rule, v->get<bool>());
  out = v->get<bool>();
  return true;
}

bool Section::read_bool(const char* key, std::optional<bool>& out, const AutoRule<bool>* rule) {
  bool b = out.value_or(false);
  if (!read_bool(key, b, rule)) return false;
  out = b;
  return true;
}

bool Section::whole(const char* key, const json& v, int64_t& out) {
  std::string why;
  if (v.is_number_integer()) {
    if (const auto x = detail::json_int64(v, &why)) {
      out = *x;
      return true;
    }
    problem(key, why);
    return false;
  }
  // DeepSpeed files often write sizes as 5e8, which JSON reads as a float.
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::nearbyint(d) == d && std::fabs(d) < 9.2e18) {
      out = static_cast<int64_t>(d);
      return true;
    }
  }
  problem(key, fmt::format("must be a whole number, got {}", detail::json_brief(v)));
  return false;
}

bool Section::read_int(const char* key, int64_t& out, int64_t lo, int64_t hi, const AutoRule<int64_t>* rule) {
  const json* got = get(key);
  if (!got) return false;
  const json* v = &coerced(*got, 'i');
  int64_t x = out;
  if (is_auto(key, *v)) {
    if (!take_auto(key, rule, x, show(out))) return false;
    if (x < lo || x > hi) {
      problem(key, fmt::format("is \"auto\" and AutoValues::{} makes it {}; allowed: {} to {}", rule->field, x, lo, hi));
      return false;
    }
    out = x;
    return true;
  }
  if (!whole(key, *v, x)) return false;
  if (x < lo || x > hi) {
    problem(key, fmt::format("is {}; allowed: {} to {}", x, lo, hi));
    return false;
  }
  check_match(key, rule, x);
  out = x;
  return true;
}

bool Section::read_int(const char* key, int& out, int lo, int hi, const AutoRule<int64_t>* rule) {
  int64_t x = out;
  if (!read_int(key, x, lo, hi, rule)) return false;
  out = static_cast<int>(x);
  return true;
}

bool Section::read_int(const char* key, std::optional<int64_t>& out, int64_t lo, int64_t hi,
                       const AutoRule<int64_t>* rule) {
  const json* v = get(key);
  if (!v) return false;
  if (is_auto(key, *v) && !(rule && rule->program) && (!rule || rule->has_default)) {
    // The default of an optional setting is "not set".
    file_->filled(where(key), fmt::format("not set (the default{})", rule ? fmt::format(
                                              "; set AutoValues::{} to choose it", rule->field) : ""));
    return false;
  }
  int64_t x = out.value_or(0);
  if (!read_int(key, x, lo, hi, rule)) return false;
  out = x;
  return true;
}

bool Section::read_double(const char* key, double& out, double lo, double hi, const AutoRule<double>* rule) {
  const json* got = get(key);
  if (!got) return false;
  const json* v = &coerced(*got, 'd');
  double x = out;
  if (is_auto(key, *v)) {
    if (!take_auto(key, rule, x, show(out))) return false;
  } else if (!v->is_number()) {
    problem(key, fmt::format("must be a number, got {}", detail::json_brief(*v)));
    return false;
  } else {
    x = v->get<double>();
    check_match(key, rule, x);
  }
  if (!(std::isfinite(x) && x >= lo && x <= hi)) {
    problem(key, fmt::format("is {}; allowed: {} to {}", x, lo, hi));
    return false;
  }
  out = x;
  return true;
}

bool Section::read_float(const char* key, float& out, double lo, double hi, const AutoRule<double>* rule) {
  // The double a float's shortest form reads as (0.01f as 0.01, not
  // 0.009999999776482582), so a default shown in a note reads as written.
  double x = std::strtod(fmt::format("{}", out).c_str(), nullptr);
  if (!read_double(key, x, lo, hi, rule)) return false;
  out = static_cast<float>(x);
  return true;
}

int Section::read_choice(const char* key, const std::vector<std::string>& allowed) {
  const json* v = get(key);
  if (!v) return -1;
  if (!v->is_string() || is_auto(key, *v)) {
    problem(key, fmt::format("must be one of {}; got {}", join(allowed), detail::json_brief(*v)));
    return -1;
  }
  const std::string s = lower(v->get<std::string>());
  for (size_t i = 0; i < allowed.size(); ++i) {
    if (lower(allowed[i]) == s) return static_cast<int>(i);
  }
  const auto near = did_you_mean(v->get<std::string>(), allowed);
  problem(key, fmt::format("is {}{}; allowed: {}", detail::json_brief(*v),
                           near ? fmt::format(" (did you mean \"{}\"?)", *near) : "", join(allowed)));
  return -1;
}

std::optional<Section> Section::sub(const char* key, Unknown unknown) {
  const json* v = get(key);
  if (!v) return std::nullopt;
  if (!v->is_object()) {
    problem(key, fmt::format("must be an object ({{...}}), got {}", detail::json_brief(*v)));
    return std::nullopt;
  }
  Section s(*file_, *v, where(key), unknown);
  s.lax_ = lax_;
  return s;
}

void Section::ignore(const char* key, const std::string& reason) {
  if (get(key)) file_->ignored(where(key), reason);
}

void Section::finish() {
  if (!j_.is_object()) return;
  std::vector<std::string> sorted = known_;
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  const std::string name = path_.empty() ? "the top level" : path_;
  for (const auto& [key, value] : j_.items()) {
    if (std::find(known_.begin(), known_.end(), key) != known_.end()) continue;
    // Past the caps a key is only counted: no message is built for it, and
    // no "did you mean" search runs (100,000 keys would take seconds).
    if (unknown_ == Unknown::kRefuse && file_->problems_full()) {
      file_->problem({});
      continue;
    }
    if (unknown_ != Unknown::kRefuse && file_->problems_full() && file_->ignored_full()) {
      file_->ignored({}, {});
      continue;
    }
    const std::string shown = detail::json_key_text(key);  // "stage\u0000x", not "stage"
    const std::string path = path_.empty() ? shown : path_ + "." + shown;
    const auto near = did_you_mean(key, sorted);
    if (unknown_ == Unknown::kRefuse) {
      file_->problem(fmt::format("unknown key '{}' in {}{}; DeepSpeed accepts here: {}", path, name,
                                 near ? fmt::format(" (did you mean '{}'?)", *near) : "", join(sorted)));
    } else if (near && !key.starts_with("_") && lax_) {
      // fp16 and bf16 are pydantic models in DeepSpeed now: a typo is refused.
      file_->problem(fmt::format("unknown key '{}' in {} (did you mean '{}'?): DeepSpeed's model of the section "
                                 "refuses it; correct it, or remove it",
                                 path, name, *near));
    } else if (near && !key.starts_with("_")) {
      // DeepSpeed runs such a file, skipping the key: so does ZEST, saying so.
      file_->warn(path, fmt::format("an unknown key in {} (did you mean '{}'?): skipped, as DeepSpeed skips it "
                                    "silently; correct it, or remove it",
                                    name, *near));
    } else if (deepspeed_reads(path_, key)) {
      // Every key of the schema has a reading here (test_ds_schema): one
      // without is refused rather than called unread.
      file_->problem(fmt::format("'{}' is a key DeepSpeed reads (its schema at commit {:.12}) that this ZEST does "
                                 "not handle; remove it",
                                 path, kDeepSpeedSchemaCommit));
    } else if (key.starts_with("_")) {
      file_->ignored(path, "a comment");
    } else if (lax_) {
      // fp16 and bf16: dict lookups in DeepSpeed until its pydantic models,
      // which forbid other keys; real files still carry such keys.
      file_->ignored(path, "not a key of DeepSpeed's current model for this section (which refuses it; older "
                           "DeepSpeed ignored it): ZEST ignores it");
    } else {
      file_->ignored(path, "DeepSpeed does not read this key either");
    }
  }
}

}  // namespace zest::config_detail
