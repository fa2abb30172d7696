// A yes-or-no setting from the environment, as the ZEST_* switches take it.
#pragma once

#include <optional>
#include <string_view>

namespace zest {

// The environment variable `name` as a switch: true for "1", false for "0",
// nullopt when unset or empty. Anything else throws zest::Error naming the
// variable, its value and `meaning` (what 1 and 0 do, e.g. "set 1 for a
// communication thread, 0 for none, or unset it for the default").
std::optional<bool> env_flag(const char* name, std::string_view meaning);

}  // namespace zest
