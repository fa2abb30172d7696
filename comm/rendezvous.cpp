#include "zest/comm/rendezvous.h"

#include <algorithm>
#include <cstring>
#include <thread>

namespace zest {
namespace {

// strerror_r comes in two flavours (GNU returns the text, POSIX fills the
// buffer); overloads pick whichever this libc has.
[[maybe_unused]] const char* strerror_result(const char* text, const char* /*buf*/) { return text; }
[[maybe_unused]] const char* strerror_result(int rc, const char* buf) {
  return rc == 0 ? buf : "unknown error";
}

}  // namespace

std::chrono::milliseconds Deadline::remaining() const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

std::chrono::milliseconds Deadline::elapsed() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
}

std::string errno_text(int err) {
  char buf[256] = {};
  return strerror_result(strerror_r(err, buf, sizeof(buf)), buf);
}

void sleep_within(const Deadline& deadline, std::chrono::milliseconds wait) {
  std::this_thread::sleep_for(std::min(wait, deadline.remaining()));
}

}  // namespace zest
