// env_flag: the ZEST_* switches read 1, 0 or nothing, and refuse the rest by name.
#include <doctest/doctest.h>

#include <cstdlib>

#include "error_of.h"
#include "zest/core/env_flag.h"

using namespace zest;

TEST_CASE("env_flag: 1 and 0, unset or empty, and a value it refuses") {
  constexpr const char* kName = "ZEST_TEST_ENV_FLAG";
  ::unsetenv(kName);
  CHECK(!env_flag(kName, "unused").has_value());
  ::setenv(kName, "", 1);
  CHECK(!env_flag(kName, "unused").has_value());
  ::setenv(kName, "1", 1);
  CHECK(env_flag(kName, "unused") == std::optional<bool>(true));
  ::setenv(kName, "0", 1);
  CHECK(env_flag(kName, "unused") == std::optional<bool>(false));
  ::setenv(kName, "yes", 1);
  const std::string e = test::error_of([&] { (void)env_flag(kName, "set 1 to do it, 0 not to"); });
  CHECK(e.find("ZEST_TEST_ENV_FLAG is 'yes', not 0 or 1: set 1 to do it, 0 not to") != std::string::npos);
  ::unsetenv(kName);
}
