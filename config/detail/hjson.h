// Hjson, as DeepSpeed reads its config files (hjson.load in
// deepspeed/runtime/config.py): JSON plus comments (#, // and /* */),
// optional and trailing commas, unquoted keys, single-quoted and
// quoteless strings, ''' multiline strings and an optional root brace.
// Internal (not installed): parse_json calls it with JsonLimits::hjson.
//
// hjson_to_json rewrites the text as the JSON it means, and `origin` maps
// every byte of the JSON back to the byte of `text` it came from, so that
// parse_json's errors (duplicate keys included, which DeepSpeed's
// dict_raise_error_on_duplicate_keys refuses too) point into the file as
// written. A JSON file comes back unchanged but for whitespace.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace zest::detail {

struct HjsonText {
  std::string json;
  std::vector<size_t> origin;  // json.size() + 1 entries: the last is text.size()
};

// Throws a zest::Error starting with `source` and the byte offset of what
// no Hjson reader accepts (an unterminated string or comment, a key without
// its ':'), or values nested deeper than `max_depth`.
HjsonText hjson_to_json(std::string_view text, const std::string& source, int max_depth);

}  // namespace zest::detail
