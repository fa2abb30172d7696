// Command-line parsing shared by the examples: numbers and comma lists that
// name the flag and the allowed range when they are wrong.
#pragma once

#include <algorithm>
#include <charconv>
#include <stdexcept>
#include <string_view>
#include <vector>

#include <fmt/format.h>

namespace examples {

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
T number(std::string_view flag, std::string_view text, T min, T max) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    throw UsageError(fmt::format("{} '{}': expected a whole number from {} to {}", flag, text, min, max));
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

}  // namespace examples
