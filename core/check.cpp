#include "zest/core/check.h"

#include "zest/core/rank_context.h"

namespace zest {
namespace {

std::string decorate(const std::string& message, const char* file, int line) {
  const RankContext ctx = this_rank();
  if (ctx.rank >= 0) {
    return fmt::format("[rank {}] {} ({}:{})", ctx.rank, message, file, line);
  }
  return fmt::format("{} ({}:{})", message, file, line);
}

}  // namespace

Error::Error(std::string message, const char* file, int line)
    : std::runtime_error(decorate(message, file, line)),
      message_(std::move(message)),
      file_(file),
      line_(line) {}

std::string current_exception_text() {
  try {
    throw;
  } catch (const Error& e) {
    return e.message();
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

namespace detail {

void throw_error(const char* file, int line, std::string message) {
  throw Error(std::move(message), file, line);
}

void internal_assert_fail(const char* file, int line, const char* expr, std::string message) {
  std::string text = fmt::format("internal error in ZEST: `{}` does not hold", expr);
  if (!message.empty()) {
    text += ": " + message;
  }
  text += "; this is a bug in ZEST, please report it with this message";
  throw Error(std::move(text), file, line);
}

}  // namespace detail
}  // namespace zest
