#include "zest/core/deadline.h"

#include <algorithm>

namespace zest {

std::chrono::milliseconds Deadline::remaining() const {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end_ - Clock::now());
  return std::max(left, std::chrono::milliseconds(0));
}

std::chrono::microseconds Deadline::remaining_us() const {
  const auto left = std::chrono::duration_cast<std::chrono::microseconds>(end_ - Clock::now());
  return std::max(left, std::chrono::microseconds(0));
}

std::chrono::milliseconds Deadline::elapsed() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start_);
}

}  // namespace zest
