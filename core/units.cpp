#include "zest/core/units.h"

#include <fmt/format.h>

#include <cstdlib>

namespace zest {

std::string format_bytes(int64_t bytes) {
  const char* sign = bytes < 0 ? "-" : "";
  const uint64_t mag = bytes < 0 ? uint64_t(0) - static_cast<uint64_t>(bytes) : static_cast<uint64_t>(bytes);
  if (mag < kKiB) return fmt::format("{}{} B", sign, mag);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(mag) / 1024.0;
  int unit = 0;
  while (v >= 1024.0 && unit < 5) {
    v /= 1024.0;
    ++unit;
  }
  return fmt::format("{}{:.2f} {}", sign, v, kUnits[unit]);
}

}  // namespace zest
