// Byte-size constants and human-readable formatting of sizes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace zest {

inline constexpr size_t kKiB = size_t{1} << 10;
inline constexpr size_t kMiB = size_t{1} << 20;
inline constexpr size_t kGiB = size_t{1} << 30;

// "512 B", "1.50 KiB", "20.00 MiB", "3.25 GiB"; negative values keep their sign
// (stat deltas).
std::string format_bytes(int64_t bytes);

constexpr size_t round_up(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace zest
