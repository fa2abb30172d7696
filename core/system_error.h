// The text of an errno value for error messages. strerror() may share one
// buffer between threads, and in-process ranks are threads, so every
// message about a failed system call takes its text from here.
#pragma once

#include <string>

namespace zest {

// strerror(err), thread-safe.
std::string errno_text(int err);

}  // namespace zest
