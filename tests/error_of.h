// The message of the zest::Error a callable throws, for checks on what an
// error says.
#pragma once

#include <string>

#include "zest/core/check.h"

namespace zest::test {

// "(no error)" when fn throws none, so that a check for a message fails
// with that text in view; any other exception propagates.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.message();
  }
  return "(no error)";
}

}  // namespace zest::test
