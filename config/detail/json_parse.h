// The one JSON parser every file ZEST reads goes through: DeepSpeed config
// files, checkpoint manifests, safetensors headers and zest-estimate's units
// files. Internal (not installed): callers include nlohmann's json.hpp.
//
//   // zest-example
//   std::string text = R"({"format": 1})";
//   nlohmann::json doc = detail::parse_json(text, "checkpoint manifest 'ck/manifest.json'",
//                                           {.max_depth = 8});
//
// nlohmann's own parse accepts anything its grammar does: a value nested
// 100,000 deep (whose dump() in an error message then overflows the stack),
// a key twice in one object (the last silently wins), and 1e400 (a bare
// "number overflow" with no file). parse_json drives nlohmann's SAX parser
// and builds the document itself, so every one of these is refused before
// the document grows, in one zest::Error that starts with `source` and gives
// the byte offset (just past the offending token) and the key path:
//
//   checkpoint manifest 'ck/manifest.json': byte 812 (at files[3].crc32):
//   the number 1e400 is beyond a double's range (about 1.8e308)
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace zest::detail {

struct JsonLimits {
  // Objects and arrays inside each other, the top-level value counting as
  // 1. What a file of the kind holds, with room to spare: never more than a
  // few hundred, so that no caller recurses deep on a parsed document.
  int max_depth = 16;
  // Read as Hjson (config/detail/hjson.h), as DeepSpeed reads its config files:
  // comments, trailing commas, unquoted keys and strings. Byte offsets in
  // errors are the file's as written.
  bool hjson = false;
};

// Parses `text` as one JSON value (nothing but whitespace after it).
nlohmann::json parse_json(std::string_view text, const std::string& source, JsonLimits limits = {});

// A JSON integer as int64 with the reason it is not one: nlohmann stores
// non-negative integers as uint64, so 2^63 is not negative but too large.
// Returns nullopt and sets `why` ("is 9223372036854775808, above the largest
// 64-bit integer") when `v` is not an integer in int64's range.
std::optional<int64_t> json_int64(const nlohmann::json& v, std::string* why = nullptr);

// v.dump(), at most `max_chars` characters (hostile values can be long).
std::string json_brief(const nlohmann::json& v, size_t max_chars = 64);

// A key as an error shows it: escaped as JSON writes it ("a\u0000b", where
// the raw text would end the message at the NUL), without the quotes, at
// most 80 characters and "...".
std::string json_key_text(const std::string& key);

}  // namespace zest::detail
