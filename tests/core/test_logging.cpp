#include <doctest/doctest.h>

#include <string>
#include <thread>
#include <vector>

#include "zest/core/check.h"
#include "zest/core/logging.h"
#include "zest/core/rank_context.h"

namespace {
std::vector<std::string> g_lines;
void capture(zest::LogLevel, std::string_view line) { g_lines.emplace_back(line); }

struct CaptureLogs {
  zest::LogLevel saved = zest::log_level();
  CaptureLogs() {
    g_lines.clear();
    zest::set_log_sink(capture);
  }
  ~CaptureLogs() {
    zest::set_log_sink(nullptr);
    zest::set_log_level(saved);
  }
};
}  // namespace

TEST_CASE("log lines carry level and rank and honour the level") {
  CaptureLogs logs;
  zest::set_log_level(zest::LogLevel::kInfo);
  zest::ScopedRank rank(2, 4);
  int evaluated = 0;
  ZEST_LOG_DEBUG("hidden {}", ++evaluated);
  ZEST_LOG_INFO("step {} loss {:.2f}", 7, 0.5);
  ZEST_LOG_ERROR("bad");
  CHECK(evaluated == 0);  // arguments of disabled levels are not evaluated
  REQUIRE(g_lines.size() == 2);
  CHECK(g_lines[0].starts_with("[zest "));
  CHECK(g_lines[0].ends_with(" I r2/4] step 7 loss 0.50\n"));
  CHECK(g_lines[1].ends_with(" E r2/4] bad\n"));
}

TEST_CASE("lines from many rank threads are never interleaved") {
  CaptureLogs logs;
  zest::set_log_level(zest::LogLevel::kInfo);
  std::vector<std::thread> threads;
  for (int r = 0; r < 4; ++r) {
    threads.emplace_back([r] {
      zest::ScopedRank rank(r, 4);
      for (int i = 0; i < 200; ++i) ZEST_LOG_INFO("rank {} line {}", r, i);
    });
  }
  for (auto& t : threads) t.join();
  REQUIRE(g_lines.size() == 800);
  for (const std::string& line : g_lines) {
    const auto tag = line.find(" I r");
    REQUIRE(tag != std::string::npos);
    const char rank = line[tag + 4];
    CHECK(line.find(std::string("] rank ") + rank + " line ") != std::string::npos);
    CHECK(line.back() == '\n');
  }
}

TEST_CASE("log levels parse, and a bad one names the accepted values") {
  CHECK(zest::parse_log_level("debug") == zest::LogLevel::kDebug);
  CHECK(zest::parse_log_level("off") == zest::LogLevel::kOff);
  CHECK_THROWS_WITH_AS(zest::parse_log_level("loud"),
                       doctest::Contains("expected trace, debug, info, warn, error or off"),
                       zest::Error);
}
