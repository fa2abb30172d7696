// What the config tests ask of a parse: its error, or a key's note.
#pragma once

#include <string>

#include "zest/config/config.h"
#include "zest/core/check.h"

namespace zest::test {

// The error parse_config_json throws for `text`, or "no error".
inline std::string error_of(const std::string& text, const AutoValues& program = {}) {
  try {
    (void)parse_config_json(text, program);
  } catch (const Error& e) {
    return e.message();
  }
  return "no error";
}

// The reason noted for an ignored key, or "" when it was not ignored.
inline std::string ignored_reason(const EngineConfig& c, const std::string& key) {
  for (const ConfigNote& n : c.ignored)
    if (n.key == key) return n.text;
  return "";
}

}  // namespace zest::test
