// ZEST's one family of error checks.
//
//   ZEST_CHECK(cond, fmt, args...)   user-facing: always on; the message says
//                                    what was wrong and what to do. Throws
//                                    zest::Error.
//   ZEST_FAIL(fmt, args...)          the same, unconditionally.
//   ZEST_INTERNAL_ASSERT(cond[, fmt, args...])
//                                    a broken invariant inside ZEST (a bug,
//                                    not bad input). Always on, never
//                                    compiled out. Throws zest::Error.
//
// Library failures (CUDA, NCCL, MPI) have their own macros in cuda_check.h and
// mpi_check.h, reporting the failed expression, file:line, rank, device and the
// library's own error string through the same Error type.
//
// Every message carries the rank when one is known (see rank_context.h) and the
// source location, as "[rank 2] message (memory/caching_allocator.cpp:120)".
#pragma once

#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "zest/core/platform.h"

namespace zest {

class Error : public std::runtime_error {
 public:
  Error(std::string message, const char* file, int line);

  // The message alone, without rank and location.
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

// The message of the exception being handled, for errors that quote it:
// Error::message() for ZEST's own (without the rank and location its what()
// adds, which the quoting error adds again), what() for other exceptions.
// Call it in a catch block.
std::string current_exception_text();

namespace detail {

[[noreturn]] void throw_error(const char* file, int line, std::string message);
[[noreturn]] void internal_assert_fail(const char* file, int line, const char* expr,
                                       std::string message);

inline std::string format_optional() { return {}; }
template <typename... Args>
std::string format_optional(fmt::format_string<Args...> f, Args&&... args) {
  return fmt::format(f, std::forward<Args>(args)...);
}

}  // namespace detail
}  // namespace zest

#define ZEST_CHECK(cond, ...)                                                        \
  do {                                                                               \
    if (ZEST_UNLIKELY(!(cond))) {                                                    \
      ::zest::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__));   \
    }                                                                                \
  } while (0)

#define ZEST_FAIL(...) ::zest::detail::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))

#define ZEST_INTERNAL_ASSERT(cond, ...)                                              \
  do {                                                                               \
    if (ZEST_UNLIKELY(!(cond))) {                                                    \
      ::zest::detail::internal_assert_fail(                                          \
          __FILE__, __LINE__, #cond,                                                 \
          ::zest::detail::format_optional(__VA_OPT__(__VA_ARGS__)));                 \
    }                                                                                \
  } while (0)
