#include "zest/core/env_flag.h"

#include <cstdlib>

#include "zest/core/check.h"

namespace zest {

std::optional<bool> env_flag(const char* name, std::string_view meaning) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return std::nullopt;
  const std::string_view value(env);
  ZEST_CHECK(value == "0" || value == "1", "{} is '{}', not 0 or 1: {}", name, value, meaning);
  return value == "1";
}

}  // namespace zest
