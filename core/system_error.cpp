#include "zest/core/system_error.h"

#include <cstring>

namespace zest {
namespace {

// strerror_r comes in two flavours (GNU returns the text, which need not be
// in buf; POSIX fills buf); overloads pick whichever this libc has.
[[maybe_unused]] const char* strerror_result(const char* text, const char* /*buf*/) { return text; }
[[maybe_unused]] const char* strerror_result(int rc, const char* buf) {
  return rc == 0 ? buf : "unknown error";
}

}  // namespace

std::string errno_text(int err) {
  char buf[256] = {};
  return strerror_result(strerror_r(err, buf, sizeof(buf)), buf);
}

}  // namespace zest
