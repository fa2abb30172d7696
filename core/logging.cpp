#include "zest/core/logging.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <mutex>

#include "zest/core/check.h"
#include "zest/core/rank_context.h"

namespace zest {
namespace {

LogLevel level_from_env() {
  const char* v = std::getenv("ZEST_LOG_LEVEL");
  if (v == nullptr || *v == '\0') return LogLevel::kInfo;
  try {
    return parse_log_level(v);
  } catch (const Error& e) {
    std::fprintf(stderr, "[zest] ignoring ZEST_LOG_LEVEL: %s\n", e.message().c_str());
    return LogLevel::kInfo;
  }
}

std::atomic<int>& level_storage() {
  static std::atomic<int> level{static_cast<int>(level_from_env())};
  return level;
}

std::mutex g_write_mutex;
LogSink g_sink = nullptr;  // guarded by g_write_mutex

char level_letter(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace: return 'T';
    case LogLevel::kDebug: return 'D';
    case LogLevel::kInfo: return 'I';
    case LogLevel::kWarn: return 'W';
    case LogLevel::kError: return 'E';
    case LogLevel::kOff: break;
  }
  return '?';
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(level_storage().load(std::memory_order_relaxed)); }

void set_log_level(LogLevel level) {
  level_storage().store(static_cast<int>(level), std::memory_order_relaxed);
}

LogLevel parse_log_level(std::string_view text) {
  struct Name {
    std::string_view name;
    LogLevel level;
  };
  static constexpr Name kNames[] = {{"trace", LogLevel::kTrace}, {"debug", LogLevel::kDebug},
                                    {"info", LogLevel::kInfo},   {"warn", LogLevel::kWarn},
                                    {"warning", LogLevel::kWarn}, {"error", LogLevel::kError},
                                    {"off", LogLevel::kOff}};
  for (const Name& n : kNames) {
    if (n.name == text) return n.level;
  }
  ZEST_FAIL("unknown log level '{}'; expected trace, debug, info, warn, error or off", text);
}

void set_log_sink(LogSink sink) {
  std::lock_guard<std::mutex> lock(g_write_mutex);
  g_sink = sink;
}

namespace detail {

void log_write(LogLevel level, std::string_view message) {
  const auto now = std::chrono::system_clock::now();
  const std::time_t secs = std::chrono::system_clock::to_time_t(now);
  const auto millis =
      std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()).count() % 1000;
  std::tm local{};
  localtime_r(&secs, &local);

  const RankContext ctx = this_rank();
  std::string rank;
  if (ctx.rank >= 0) {
    rank = ctx.world_size > 0 ? fmt::format(" r{}/{}", ctx.rank, ctx.world_size)
                              : fmt::format(" r{}", ctx.rank);
  }
  const std::string line =
      fmt::format("[zest {:02}:{:02}:{:02}.{:03} {}{}] {}\n", local.tm_hour, local.tm_min,
                  local.tm_sec, millis, level_letter(level), rank, message);

  std::lock_guard<std::mutex> lock(g_write_mutex);
  if (g_sink != nullptr) {
    g_sink(level, line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

}  // namespace detail
}  // namespace zest
