// Rank-prefixed logging through fmt.
//
//   // zest-example: run
//   int step = 10;
//   double loss = 0.1234;
//   ZEST_LOG_INFO("step {} loss {:.4f}", step, loss);
//
// prints "[zest 12:03:04.512 I r1/4] step 10 loss 0.1234" to stderr, one whole
// line per call even when several rank threads log at once. The level comes
// from the environment variable ZEST_LOG_LEVEL (trace, debug, info, warn,
// error, off; default info) and can be changed with set_log_level. Arguments
// are not evaluated when the level is off.
#pragma once

#include <fmt/format.h>

#include <string>
#include <string_view>

namespace zest {

enum class LogLevel : int { kTrace = 0, kDebug, kInfo, kWarn, kError, kOff };

LogLevel log_level();
void set_log_level(LogLevel level);
// Parses a ZEST_LOG_LEVEL value; throws zest::Error naming the allowed values.
LogLevel parse_log_level(std::string_view text);

inline bool log_enabled(LogLevel level) { return level >= log_level() && level != LogLevel::kOff; }

// Where log lines go; stderr unless replaced (tests capture them). The sink is
// called with whole lines, under a lock. nullptr restores stderr.
using LogSink = void (*)(LogLevel level, std::string_view line);
void set_log_sink(LogSink sink);

namespace detail {
void log_write(LogLevel level, std::string_view message);
}  // namespace detail

}  // namespace zest

#define ZEST_LOG(level, ...)                                             \
  do {                                                                   \
    if (::zest::log_enabled(level)) {                                    \
      ::zest::detail::log_write(level, ::fmt::format(__VA_ARGS__));      \
    }                                                                    \
  } while (0)

#define ZEST_LOG_TRACE(...) ZEST_LOG(::zest::LogLevel::kTrace, __VA_ARGS__)
#define ZEST_LOG_DEBUG(...) ZEST_LOG(::zest::LogLevel::kDebug, __VA_ARGS__)
#define ZEST_LOG_INFO(...) ZEST_LOG(::zest::LogLevel::kInfo, __VA_ARGS__)
#define ZEST_LOG_WARN(...) ZEST_LOG(::zest::LogLevel::kWarn, __VA_ARGS__)
#define ZEST_LOG_ERROR(...) ZEST_LOG(::zest::LogLevel::kError, __VA_ARGS__)
