// Command-line parsing of tools/, and of the examples and bench/ above them.
// CLI11 (Debian libcli11-dev) parses, behind this header: cli::App,
// cli::Option and cli::Validator keep CLI11's names and calls, and only
// cli.cpp includes CLI11, which costs 7-11 s of compile in every unit that
// includes it (its validators are objects of every unit, its App's
// virtual members compiled wherever one is made). A bad argument becomes a
// UsageError naming the flag and its value ("--world: Value 2147483648 not
// in range 1 to 1048576"). A program catches UsageError, prints it with its
// usage, and exits with 2. Every numeric flag gets a range:
//
//   cli::App app;
//   app.add_option("--world", world)->check(cli::Range(1, 1 << 20));
//   app.add_option("--lr", lr)->check(cli::real_range(0, 1e6));
//   cli::parse(app, argc, argv);
//
// The older helpers at the end (number, choice, for_each_flag) serve the
// programs that read their flags by hand.
#pragma once

#include <algorithm>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "zest/core/check.h"
#include "zest/core/device.h"

namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI

namespace zest {
struct CommOptions;
}

namespace cli {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename... Args>
[[noreturn]] void usage_error(fmt::format_string<Args...> f, Args&&... args) {
  throw UsageError(fmt::format(f, std::forward<Args>(args)...));
}

// A check of an option's text: CLI11's Range and IsMember, or a function
// that returns "" for an acceptable text and otherwise why it is not.
class Validator {
 public:
  Validator(std::function<std::string(std::string&)> check, std::string description);

 private:
  friend class Option;
  friend struct ValidatorAccess;
  explicit Validator(std::shared_ptr<const CLI::Validator> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const CLI::Validator> impl_;
};

// CLI::Range: a number of type T in [min, max] ("Value 9 not in range 0 to
// 3"). Defined for int, unsigned, long, unsigned long and double.
template <typename T>
Validator Range(T min, T max);

// CLI::IsMember: one of `allowed` ("x not in {a,b}").
Validator IsMember(std::vector<std::string> allowed);

// A finite real number in [lo, hi]: "abc", "nan", "inf" and "1e400" are
// refused with the range (CLI::Range prints floats unreadably and lets NaN
// through).
Validator real_range(double lo, double hi);

// One option of an App (CLI::Option's calls that ZEST's programs use).
class Option {
 public:
  Option* check(const Validator& validator);
  Option* delimiter(char separator);      // a list given as "a,b,c"
  Option* excludes(Option* other);        // not both on one command line
  Option* allow_extra_args(bool allow);   // a list's values one flag each
  std::size_t count() const;              // times given on the command line

 private:
  friend class App;
  explicit Option(CLI::Option* impl) : impl_(impl) {}
  CLI::Option* impl_;
};

// A program's flags (CLI::App): the value of each option is written into
// the variable it names when the command line is parsed.
class App {
 public:
  explicit App(std::string description = "", std::string name = "");
  ~App();
  App(const App&) = delete;
  App& operator=(const App&) = delete;

  Option* add_option(std::string name, int& value, std::string description = "");
  Option* add_option(std::string name, long& value, std::string description = "");
  Option* add_option(std::string name, long long& value, std::string description = "");
  Option* add_option(std::string name, unsigned& value, std::string description = "");
  Option* add_option(std::string name, unsigned long& value, std::string description = "");
  Option* add_option(std::string name, unsigned long long& value, std::string description = "");
  Option* add_option(std::string name, float& value, std::string description = "");
  Option* add_option(std::string name, double& value, std::string description = "");
  Option* add_option(std::string name, std::string& value, std::string description = "");
  Option* add_option(std::string name, std::vector<int>& value, std::string description = "");
  Option* add_option(std::string name, std::vector<long>& value, std::string description = "");
  Option* add_option(std::string name, std::vector<double>& value, std::string description = "");
  Option* add_option(std::string name, std::vector<std::string>& value, std::string description = "");
  // A real number handed to `on` when given (CLI::App::add_option_function).
  Option* add_option_function(std::string name, std::function<void(const double&)> on,
                              std::string description = "");
  Option* add_flag(std::string name, bool& value, std::string description = "");

  Option* get_option(const std::string& name);  // by one of its names; throws when there is none
  std::size_t count(const std::string& name) const;
  std::string help() const;
  // The help flag (default -h,--help); set_help_flag() removes it.
  void set_help_flag(std::string name = "", std::string description = "");
  // Parses argv: --help is UsageError("help") (the caller prints its
  // usage), any other error a UsageError with CLI11's message, which names
  // the flag and the value.
  void parse(int argc, char** argv);

 private:
  Option* wrap(CLI::Option* option);
  std::unique_ptr<CLI::App> impl_;
  std::vector<std::unique_ptr<Option>> options_;
  std::map<const CLI::Option*, Option*> by_impl_;
};

inline void parse(App& app, int argc, char** argv) { app.parse(argc, argv); }

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

// --timeout SECONDS, for every program that communicates: how long a
// collective waits for the other ranks before it fails naming them
// (CommOptions::timeout, decimals allowed). Without the flag, `options`
// keeps its default: ZEST_COMM_TIMEOUT's value, else 10 minutes.
Option* add_timeout(App& app, zest::CommOptions& options);

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
