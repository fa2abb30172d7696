// Command-line parsing of tools/, and of the examples and bench/ above them:
// CLI11 (Debian libcli11-dev) parses, and a bad argument becomes a
// UsageError naming the flag and its value ("--world: Value 2147483648 not
// in range 1 to 1048576"). A program catches UsageError, prints it with its
// usage, and exits with 2. Every numeric flag gets a range:
//
//   CLI::App app;
//   app.add_option("--world", world)->check(CLI::Range(1, 1 << 20));
//   app.add_option("--lr", lr)->check(cli::real_range(0, 1e6));
//   cli::parse(app, argc, argv);
//
// The older helpers below (number, choice, for_each_flag) serve the programs
// not yet moved to CLI11.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/comm/communicator.h"
#include "zest/core/check.h"
#include "zest/core/device.h"

namespace cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void usage_error(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

// Parses argv with `app`: --help is UsageError("help") (the caller prints
// its usage), any other error a UsageError with CLI11's message, which names
// the flag and the value.
inline void parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw UsageError("help");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
}

// main's answer to a UsageError: --help prints the usage on stdout and
// returns 0; anything else names the problem, then the usage, on stderr and
// returns 2.
inline int usage_exit(std::string_view program, const UsageError& e, const std::string& usage) {
  if (std::string_view(e.what()) == "help") {
    std::fputs(usage.c_str(), stdout);
    return 0;
  }
  std::fprintf(stderr, "%.*s: %s\n%s", static_cast<int>(program.size()), program.data(), e.what(), usage.c_str());
  return 2;
}

// zest::parse_device for a flag ("host", "cuda", "cuda:1"), its refusal (an
// unknown name, or a GPU this build or machine does not have) a UsageError
// naming the flag.
inline zest::Device device_flag(std::string_view flag, std::string_view value) {
  try {
    return zest::parse_device(value);
  } catch (const zest::Error& e) {
    throw UsageError(fmt::format("{} {}: {}", flag, value, e.message()));
  }
}

// A finite real number in [lo, hi]: "abc", "nan", "inf" and "1e400" are
// refused with the range (CLI::Range prints floats unreadably and lets NaN
// through).
inline CLI::Validator real_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end == nullptr || *end != '\0' || !std::isfinite(v) || v < lo || v > hi) {
          return fmt::format("'{}' is not a number from {:g} to {:g}", text, lo, hi);
        }
        return {};
      },
      fmt::format("REAL in [{:g}, {:g}]", lo, hi));
}

// --timeout SECONDS, for every program that communicates: how long a
// collective waits for the other ranks before it fails naming them
// (CommOptions::timeout, decimals allowed). Without the flag, `options`
// keeps its default: ZEST_COMM_TIMEOUT's value, else 10 minutes.
inline CLI::Option* add_timeout(CLI::App& app, zest::CommOptions& options) {
  return app
      .add_option_function<double>(
          "--timeout",
          [&options](const double& seconds) {
            options.timeout = std::chrono::milliseconds(std::llround(seconds * 1000));
          },
          "seconds a collective waits for the other ranks")
      ->check(real_range(0.001, 1e6));
}

template <typename T>
T number(std::string_view flag, std::string_view text, T min, T max) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    usage_error("{} '{}': expected a whole number from {} to {}", flag, text, min, max);
  }
  return value;
}

// "0,1,2,3" -> {0, 1, 2, 3}, each in [min, max].
inline std::vector<int> number_list(std::string_view flag, std::string_view text, int min, int max) {
  std::vector<int> out;
  size_t begin = 0;
  while (begin <= text.size()) {
    const size_t comma = std::min(text.find(',', begin), text.size());
    out.push_back(number<int>(flag, text.substr(begin, comma - begin), min, max));
    begin = comma + 1;
  }
  return out;
}

// Calls on(flag, value) for each "--flag value" in argv, in order, and
// on(flag, "") for a flag of `switches`, which takes no value. --help and -h
// are UsageError("help"), for the caller to print its usage.
template <typename Fn>
void for_each_flag(int argc, char** argv, std::initializer_list<std::string_view> switches, Fn&& on) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view flag = argv[i];
    if (flag == "--help" || flag == "-h") throw UsageError("help");
    if (std::find(switches.begin(), switches.end(), flag) != switches.end()) {
      on(flag, std::string_view());
      continue;
    }
    if (i + 1 >= argc) usage_error("{} needs a value", flag);
    on(flag, std::string_view(argv[++i]));
  }
}

// `text` when it is one of `allowed`; the error lists them.
inline std::string choice(std::string_view flag, std::string_view text,
                          std::initializer_list<std::string_view> allowed) {
  if (std::find(allowed.begin(), allowed.end(), text) == allowed.end()) {
    usage_error("{} '{}': allowed values are {}", flag, text, fmt::join(allowed, ", "));
  }
  return std::string(text);
}

}  // namespace cli
