// cli::App and its options over CLI11: the one unit that includes it.
#include "cli/cli.h"

#include <CLI/CLI.hpp>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <utility>

#include "zest/comm/communicator.h"

namespace cli {

struct ValidatorAccess {
  static Validator make(CLI::Validator v) { return Validator(std::make_shared<const CLI::Validator>(std::move(v))); }
};

Validator::Validator(std::function<std::string(std::string&)> check, std::string description)
    : impl_(std::make_shared<const CLI::Validator>(std::move(check), std::move(description))) {}

template <typename T>
Validator Range(T min, T max) {
  return ValidatorAccess::make(CLI::Range(min, max));
}
template Validator Range<int>(int, int);
template Validator Range<unsigned>(unsigned, unsigned);
template Validator Range<long>(long, long);
template Validator Range<unsigned long>(unsigned long, unsigned long);
template Validator Range<double>(double, double);

Validator IsMember(std::vector<std::string> allowed) { return ValidatorAccess::make(CLI::IsMember(std::move(allowed))); }

Validator real_range(double lo, double hi) {
  return Validator(
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

Option* Option::check(const Validator& validator) {
  impl_->check(*validator.impl_);
  return this;
}

Option* Option::delimiter(char separator) {
  impl_->delimiter(separator);
  return this;
}

Option* Option::excludes(Option* other) {
  impl_->excludes(other->impl_);
  return this;
}

Option* Option::allow_extra_args(bool allow) {
  impl_->allow_extra_args(allow);
  return this;
}

std::size_t Option::count() const { return impl_->count(); }

App::App(std::string description, std::string name)
    : impl_(std::make_unique<CLI::App>(std::move(description), std::move(name))) {}

App::~App() = default;

Option* App::wrap(CLI::Option* option) {
  options_.push_back(std::unique_ptr<Option>(new Option(option)));
  by_impl_[option] = options_.back().get();
  return options_.back().get();
}

#define ZEST_CLI_ADD_OPTION(TYPE)                                                            \
  Option* App::add_option(std::string name, TYPE& value, std::string description) {          \
    return wrap(impl_->add_option(std::move(name), value, std::move(description)));          \
  }
ZEST_CLI_ADD_OPTION(int)
ZEST_CLI_ADD_OPTION(long)
ZEST_CLI_ADD_OPTION(long long)
ZEST_CLI_ADD_OPTION(unsigned)
ZEST_CLI_ADD_OPTION(unsigned long)
ZEST_CLI_ADD_OPTION(unsigned long long)
ZEST_CLI_ADD_OPTION(float)
ZEST_CLI_ADD_OPTION(double)
ZEST_CLI_ADD_OPTION(std::string)
ZEST_CLI_ADD_OPTION(std::vector<int>)
ZEST_CLI_ADD_OPTION(std::vector<long>)
ZEST_CLI_ADD_OPTION(std::vector<double>)
ZEST_CLI_ADD_OPTION(std::vector<std::string>)
#undef ZEST_CLI_ADD_OPTION

Option* App::add_option_function(std::string name, std::function<void(const double&)> on, std::string description) {
  return wrap(impl_->add_option_function<double>(std::move(name), std::move(on), std::move(description)));
}

Option* App::add_flag(std::string name, bool& value, std::string description) {
  return wrap(impl_->add_flag(std::move(name), value, std::move(description)));
}

Option* App::get_option(const std::string& name) {
  CLI::Option* option = impl_->get_option(name);  // CLI::OptionNotFound when there is none
  const auto it = by_impl_.find(option);
  return it != by_impl_.end() ? it->second : wrap(option);
}

std::size_t App::count(const std::string& name) const { return impl_->count(name); }

std::string App::help() const { return impl_->help(); }

void App::set_help_flag(std::string name, std::string description) {
  impl_->set_help_flag(std::move(name), std::move(description));
}

void App::parse(int argc, char** argv) {
  try {
    impl_->parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw UsageError("help");
  } catch (const CLI::ParseError& e) {
    throw UsageError(e.what());
  }
}

Option* add_timeout(App& app, zest::CommOptions& options) {
  return app
      .add_option_function(
          "--timeout",
          [&options](const double& seconds) {
            options.timeout = std::chrono::milliseconds(std::llround(seconds * 1000));
          },
          "seconds a collective waits for the other ranks")
      ->check(real_range(0.001, 1e6));
}

}  // namespace cli
