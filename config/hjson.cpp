// hjson_to_json: a recursive reader of Hjson's grammar (hjson-py's, which
// DeepSpeed uses) that writes the equivalent JSON. Values JSON also has
// are copied as written, so nlohmann's parser (in parse_json) still checks
// every escape and number of them.
#include "zest/config/detail/hjson.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "zest/core/check.h"

namespace zest::detail {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// JSON's number grammar, which hjson's numbers follow.
bool is_json_number(std::string_view s) {
  size_t i = 0;
  auto digits = [&] {
    const size_t start = i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) ++i;
    return i > start;
  };
  if (i < s.size() && s[i] == '-') ++i;
  if (i < s.size() && s[i] == '0') {
    ++i;
  } else if (!digits()) {
    return false;
  }
  if (i < s.size() && s[i] == '.') {
    ++i;
    if (!digits()) return false;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    if (!digits()) return false;
  }
  return i == s.size();
}

class Reader {
 public:
  Reader(std::string_view text, const std::string& source, int max_depth)
      : t_(text), source_(source), max_depth_(max_depth) {}

  HjsonText run() {
    skip();
    if (pos_ < t_.size() && (t_[pos_] == '{' || t_[pos_] == '[')) {
      value(1);
    } else if (pos_ < t_.size()) {
      // Hjson's root object may leave out its braces.
      emit('{', pos_);
      members(1, /*braced=*/false);
      emit('}', t_.size());
    }
    skip();
    if (pos_ < t_.size()) fail(pos_, "text after the end of the top-level value");
    out_.origin.push_back(t_.size());
    return std::move(out_);
  }

 private:
  [[noreturn]] void fail(size_t at, const std::string& what) const {
    ZEST_FAIL("{}: byte {}: not valid Hjson or JSON ({})", source_, std::min(at, t_.size()), what);
  }

  // Valid, but deeper than the caller allows (parse_json's words for it).
  [[noreturn]] void too_deep(int depth) const {
    ZEST_FAIL("{}: byte {}: values nest {} levels deep here, more than the {} this file may have (objects and arrays "
              "inside each other)",
              source_, std::min(pos_ + 1, t_.size()), depth, max_depth_);
  }

  void emit(char c, size_t from) {
    out_.json.push_back(c);
    out_.origin.push_back(from);
  }

  // Whitespace and comments.
  void skip() {
    while (pos_ < t_.size()) {
      const char c = t_[pos_];
      if (is_space(c)) {
        ++pos_;
      } else if (c == '#' || t_.substr(pos_, 2) == "//") {
        while (pos_ < t_.size() && t_[pos_] != '\n') ++pos_;
      } else if (t_.substr(pos_, 2) == "/*") {
        const size_t end = t_.find("*/", pos_ + 2);
        if (end == std::string_view::npos) fail(pos_, "a /* comment that is never closed");
        pos_ = end + 2;
      } else {
        return;
      }
    }
  }

  void depth_check(int depth) const {
    // At the byte just past the bracket, as parse_json counts.
    if (depth > max_depth_) too_deep(depth);
  }

  void value(int depth) {
    skip();
    if (pos_ >= t_.size()) fail(pos_, "a value is missing at the end of the text");
    const char c = t_[pos_];
    if (c == '{' || c == '[') {
      depth_check(depth);
      emit(c, pos_++);
      if (c == '{') {
        members(depth, /*braced=*/true);
      } else {
        elements(depth);
      }
    } else if (c == '"') {
      json_string();
    } else if (c == '\'') {
      t_.substr(pos_, 3) == "'''" ? multiline_string() : single_quoted();
    } else if (c == ',' || c == ':' || c == ']' || c == '}') {
      fail(pos_, fmt::format("a value cannot start with '{}'", c));
    } else {
      quoteless();
    }
  }

  // A comma, optional: a newline separates members as well.
  void separator() {
    skip();
    if (pos_ < t_.size() && t_[pos_] == ',') {
      ++pos_;
      skip();
    }
  }

  void members(int depth, bool braced) {
    bool first = true;
    for (;;) {
      skip();
      if (pos_ >= t_.size()) {
        if (braced) fail(pos_, "an object that is never closed with '}'");
        return;
      }
      if (t_[pos_] == '}') {
        if (!braced) fail(pos_, "a '}' that closes nothing");
        emit('}', pos_++);
        return;
      }
      if (!first) emit(',', pos_);
      first = false;
      key();
      skip();
      if (pos_ >= t_.size() || t_[pos_] != ':') fail(pos_, "expected ':' after the key");
      emit(':', pos_++);
      value(depth + 1);
      separator();
    }
  }

  void elements(int depth) {
    bool first = true;
    for (;;) {
      skip();
      if (pos_ >= t_.size()) fail(pos_, "an array that is never closed with ']'");
      if (t_[pos_] == ']') {
        emit(']', pos_++);
        return;
      }
      if (!first) emit(',', pos_);
      first = false;
      value(depth + 1);
      separator();
    }
  }

  void key() {
    const char c = t_[pos_];
    if (c == '"') return json_string();
    if (c == '\'') return single_quoted();
    const size_t start = pos_;
    while (pos_ < t_.size() && t_[pos_] != ':') {
      const char k = t_[pos_];
      if (is_space(k)) {
        // "key : value" is fine; "two words: value" is not.
        const size_t after = t_.find_first_not_of(" \t", pos_);
        if (after != std::string_view::npos && t_[after] == ':') break;
        fail(pos_, "whitespace inside an unquoted key (quote the key to include it)");
      }
      if (k == '{' || k == '}' || k == '[' || k == ']' || k == ',') {
        fail(pos_, fmt::format("'{}' inside an unquoted key, or a key without its ':'", k));
      }
      ++pos_;
    }
    if (pos_ == start) fail(pos_, "an empty key (write \"\" for one)");
    quote(start, pos_);
  }

  // [from, to) of the text as one JSON string.
  void quote(size_t from, size_t to) {
    emit('"', from);
    for (size_t i = from; i < to; ++i) escaped(t_[i], i);
    emit('"', to);
  }

  void escaped(char c, size_t at) {
    if (c == '"' || c == '\\') {
      emit('\\', at);
      emit(c, at);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      for (const char e : fmt::format("\\u{:04x}", static_cast<unsigned>(static_cast<unsigned char>(c)))) emit(e, at);
    } else {
      emit(c, at);
    }
  }

  // Copied as written; nlohmann checks its escapes.
  void json_string() {
    const size_t start = pos_;
    emit('"', pos_++);
    while (pos_ < t_.size() && t_[pos_] != '"') {
      if (t_[pos_] == '\\' && pos_ + 1 < t_.size()) emit(t_[pos_], pos_), ++pos_;
      emit(t_[pos_], pos_);
      ++pos_;
    }
    if (pos_ >= t_.size()) fail(start, "a string that is never closed");
    emit('"', pos_++);
  }

  void single_quoted() {
    const size_t start = pos_++;
    emit('"', start);
    while (pos_ < t_.size() && t_[pos_] != '\'') {
      if (t_[pos_] == '\\' && pos_ + 1 < t_.size()) {
        if (t_[pos_ + 1] == '\'') {
          emit('\'', pos_);
        } else {
          emit('\\', pos_);
          emit(t_[pos_ + 1], pos_ + 1);
        }
        pos_ += 2;
        continue;
      }
      if (t_[pos_] == '"') {
        emit('\\', pos_);
        emit('"', pos_);
      } else {
        emit(t_[pos_], pos_);  // a raw control character: nlohmann refuses it, as JSON does
      }
      ++pos_;
    }
    if (pos_ >= t_.size()) fail(start, "a string that is never closed");
    emit('"', pos_++);
  }

  // '''...''', as hjson-py's mlscanstring reads it: the opening column's
  // indentation (at most) is skipped at the start of each line, a line
  // break right after the opening ''' and the last one before the closing
  // ''' are not part of the string, and carriage returns are dropped.
  void multiline_string() {
    const size_t start = pos_;
    const size_t line_start = pos_ == 0 ? std::string_view::npos : t_.rfind('\n', pos_ - 1);
    const size_t indent = pos_ - (line_start == std::string_view::npos ? 0 : line_start + 1);
    auto skip_indent = [&](size_t at, size_t n) {
      for (; at < t_.size() && n > 0 && (t_[at] == ' ' || t_[at] == '\t' || t_[at] == '\r'); --n) ++at;
      return at;
    };
    size_t at = skip_indent(pos_ + 3, std::string_view::npos);
    if (at < t_.size() && t_[at] == '\n') at = skip_indent(at + 1, indent);
    emit('"', start);
    size_t quotes = 0;           // ' characters seen in a row
    size_t held_eol = t_.size();  // a line break not yet written (the last one is dropped)
    for (;;) {
      if (at >= t_.size()) fail(start, "a ''' string that is never closed");
      const char c = t_[at];
      if (c == '\'') {
        ++at;
        if (++quotes == 3) break;
        continue;
      }
      if (held_eol < t_.size()) {
        escaped('\n', held_eol);
        held_eol = t_.size();
      }
      for (; quotes > 0; --quotes) escaped('\'', at - 1);
      if (c == '\n') {
        held_eol = at;
        at = skip_indent(at + 1, indent);
      } else {
        if (c != '\r') escaped(c, at);
        ++at;
      }
    }
    emit('"', at - 3);
    pos_ = at;
  }

  // A number, true, false or null when what precedes a ',', '}', ']', a
  // comment or the line's end is one; otherwise the whole line, trimmed,
  // as a string (commas and '#' included, as Hjson reads it).
  void quoteless() {
    const size_t start = pos_;
    size_t i = pos_;
    for (;;) {
      const bool at_end = i >= t_.size() || t_[i] == '\n' || t_[i] == '\r';
      const bool stop = at_end || t_[i] == ',' || t_[i] == '}' || t_[i] == ']' || t_[i] == '#' ||
                        t_.substr(i, 2) == "//" || t_.substr(i, 2) == "/*";
      if (stop) {
        size_t e = i;
        while (e > start && (t_[e - 1] == ' ' || t_[e - 1] == '\t')) --e;
        const std::string_view word = t_.substr(start, e - start);
        if (word == "true" || word == "false" || word == "null" || is_json_number(word)) {
          for (size_t k = start; k < e; ++k) emit(t_[k], k);
          pos_ = e;
          return;
        }
        if (at_end) {
          quote(start, e);
          pos_ = i;
          return;
        }
      }
      ++i;
    }
  }

  std::string_view t_;
  const std::string& source_;
  int max_depth_;
  size_t pos_ = 0;
  HjsonText out_;
};

}  // namespace

HjsonText hjson_to_json(std::string_view text, const std::string& source, int max_depth) {
  return Reader(text, source, max_depth).run();
}

}  // namespace zest::detail
