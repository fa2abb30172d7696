// parse_json: nlohmann's SAX parser feeding a document builder of our own,
// which checks nesting, duplicate keys and numbers as each event arrives
// (before anything deeper is built), and knows the byte offset and the key
// path of every event for its errors.
#include "zest/config/detail/json_parse.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <vector>

#include "zest/config/detail/hjson.h"
#include "zest/core/check.h"

namespace zest::detail {
namespace {

using nlohmann::json;

// Text for an error message: hostile input can be megabytes long, and the
// start says enough.
std::string clip(std::string text, size_t max_chars) {
  if (text.size() > max_chars) text = text.substr(0, max_chars) + "...";
  return text;
}

// A pointer into the text that also records how far the parser has read,
// so that events (which nlohmann reports without a position) can name one.
class CountingIterator {
 public:
  using iterator_category = std::forward_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  CountingIterator() = default;
  CountingIterator(const char* p, const char** furthest) : p_(p), furthest_(furthest) {}
  reference operator*() const { return *p_; }
  CountingIterator& operator++() {
    ++p_;
    if (p_ > *furthest_) *furthest_ = p_;
    return *this;
  }
  CountingIterator operator++(int) {
    CountingIterator old = *this;
    ++*this;
    return old;
  }
  bool operator==(const CountingIterator& o) const { return p_ == o.p_; }

 private:
  const char* p_ = nullptr;
  const char** furthest_ = nullptr;
};

// Where the parser is: one entry per open object or array.
struct PathEntry {
  bool is_array = false;
  std::string key;    // objects: the key of the value being read
  size_t count = 0;   // arrays: elements started so far
};

class Builder {
 public:
  // `origin`, when set, maps each byte of `text` (translated from Hjson) to
  // the byte of the file it came from.
  Builder(std::string_view text, const char** furthest, const std::string& source, JsonLimits limits,
          const std::vector<size_t>* origin)
      : begin_(text.data()), size_(text.size()), furthest_(furthest), source_(source), limits_(limits),
        origin_(origin) {}

  json take() { return std::move(root_); }

  bool null() { return value(json(nullptr)); }
  bool boolean(bool v) { return value(json(v)); }
  bool number_integer(json::number_integer_t v) { return value(json(v)); }
  bool number_unsigned(json::number_unsigned_t v) { return value(json(v)); }
  bool number_float(json::number_float_t v, const json::string_t&) { return value(json(v)); }
  bool string(json::string_t& v) { return value(json(std::move(v))); }
  bool binary(json::binary_t& v) { return value(json::binary(std::move(v))); }

  bool start_object(std::size_t) { return open(json::object(), false); }
  bool start_array(std::size_t) { return open(json::array(), true); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }

  bool key(json::string_t& k) {
    json::object_t& obj = stack_.back()->get_ref<json::object_t&>();
    path_.back().key = k;
    const auto [it, inserted] = obj.emplace(k, nullptr);
    if (!inserted) {
      fail(fmt::format("the key \"{}\" appears twice in one object; each key may appear once (which "
                       "of the two was meant?)",
                       json_key_text(k)));
    }
    slot_ = &it->second;
    return true;
  }

  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& ex) {
    std::string what;
    if (ex.id == 406) {  // out_of_range.406: a number beyond double's range
      what = fmt::format("the number {} is beyond a double's range (about 1.8e308)", clip(last_token, 40));
    } else {
      // nlohmann's message without its "[json.exception...]" prefix.
      std::string msg = ex.what();
      if (const size_t end = msg.find("] "); msg.starts_with("[json.exception") && end != std::string::npos)
        msg = msg.substr(end + 2);
      what = "not valid JSON (" + clip(msg, 240) + ")";
    }
    fail_at(position, what, /*value_pending=*/true);
  }

 private:
  // Adds `v` where the parser is: the root, the next array element, or the
  // value of the key just read. Returns the added value.
  json* add(json&& v) {
    if (stack_.empty()) {
      root_ = std::move(v);
      return &root_;
    }
    json* top = stack_.back();
    if (top->is_array()) {
      ++path_.back().count;
      json::array_t& arr = top->get_ref<json::array_t&>();
      arr.push_back(std::move(v));
      return &arr.back();
    }
    *slot_ = std::move(v);
    return slot_;
  }

  bool value(json&& v) {
    add(std::move(v));
    return true;
  }

  bool open(json&& container, bool is_array) {
    const int depth = static_cast<int>(stack_.size()) + 1;
    if (depth > limits_.max_depth) {
      fail(fmt::format("values nest {} levels deep here, more than the {} this file may have (objects and "
                       "arrays inside each other)",
                       depth, limits_.max_depth));
    }
    stack_.push_back(add(std::move(container)));
    path_.push_back(PathEntry{is_array, {}, 0});
    return true;
  }

  bool close() {
    stack_.pop_back();
    path_.pop_back();
    return true;
  }

  // The key path of the value being read: "files[3].crc32". Array elements
  // name the element last started, or with `value_pending` (a failure
  // inside a value not yet added) the next.
  std::string path(bool value_pending) const {
    std::string out;
    for (size_t i = 0; i < path_.size(); ++i) {
      const PathEntry& e = path_[i];
      if (e.is_array) {
        const bool innermost = i + 1 == path_.size();
        const size_t index = innermost && value_pending ? e.count : (e.count == 0 ? 0 : e.count - 1);
        out += fmt::format("[{}]", index);
      } else if (!e.key.empty()) {
        out += (out.empty() ? "" : ".") + json_key_text(e.key);
      }
    }
    return out;
  }

  [[noreturn]] void fail(const std::string& what) {
    fail_at(static_cast<size_t>(*furthest_ - begin_), what, /*value_pending=*/true);
  }

  [[noreturn]] void fail_at(size_t offset, const std::string& what, bool value_pending) {
    const std::string where = path(value_pending);
    // nlohmann counts the end of input as a character read.
    offset = std::min(offset, size_);
    if (origin_) offset = (*origin_)[offset];
    ZEST_FAIL("{}: byte {}{}: {}", source_, offset, where.empty() ? "" : " (at " + where + ")", what);
  }

  const char* begin_;
  size_t size_;
  const char** furthest_;
  const std::string& source_;
  JsonLimits limits_;
  const std::vector<size_t>* origin_;
  json root_;
  std::vector<json*> stack_;  // the open containers, innermost last
  std::vector<PathEntry> path_;
  json* slot_ = nullptr;  // the value of the key just read
};

}  // namespace

json parse_json(std::string_view text, const std::string& source, JsonLimits limits) {
  ZEST_INTERNAL_ASSERT(limits.max_depth >= 1);
  HjsonText translated;
  if (limits.hjson) {
    translated = hjson_to_json(text, source, limits.max_depth);
    text = translated.json;
  }
  const char* begin = text.data();
  const char* furthest = begin;
  Builder builder(text, &furthest, source, limits, limits.hjson ? &translated.origin : nullptr);
  const bool ok = json::sax_parse(CountingIterator(begin, &furthest), CountingIterator(begin + text.size(), &furthest),
                                  &builder);
  // Every failure throws from the builder; a false return would be a SAX
  // contract change in nlohmann.
  ZEST_INTERNAL_ASSERT(ok, "{}: the JSON parser stopped without an error", source);
  return builder.take();
}

std::optional<int64_t> json_int64(const json& v, std::string* why) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(u);
    if (why) *why = fmt::format("is {}, above the largest 64-bit integer ({})", u, std::numeric_limits<int64_t>::max());
    return std::nullopt;
  }
  if (v.is_number_integer()) return v.get<int64_t>();
  if (why) *why = fmt::format("is {}, not an integer", json_brief(v));
  return std::nullopt;
}

std::string json_brief(const json& v, size_t max_chars) {
  return clip(v.dump(-1, ' ', false, json::error_handler_t::replace), max_chars);
}

std::string json_key_text(const std::string& key) {
  std::string s = json(key).dump(-1, ' ', false, json::error_handler_t::replace);
  return clip(s.substr(1, s.size() - 2), 80);  // without the quotes
}

}  // namespace zest::detail
