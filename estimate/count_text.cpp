#include "zest/estimate/count_text.h"

#include <fmt/format.h>

namespace zest {

std::string with_commas(size_t n) {
  const std::string digits = std::to_string(n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

std::string short_count(size_t n) {
  const double v = static_cast<double>(n);
  if (v >= 1e12) return fmt::format("{:.2f}T", v / 1e12);
  if (v >= 1e9) return fmt::format("{:.2f}B", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.2f}K", v / 1e3);
  return std::to_string(n);
}

SiUnit unit_for(double largest_bytes) {
  if (largest_bytes >= 1e9) return {1e9, "GB"};
  if (largest_bytes >= 1e6) return {1e6, "MB"};
  if (largest_bytes >= 1e3) return {1e3, "kB"};
  return {1.0, "B"};
}

}  // namespace zest
