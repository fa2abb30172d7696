// A point in time that a multi-step wait counts down to: every wait of one
// rendezvous, or every poll of one MPI operation, shares one deadline, so
// the whole operation (not each step) is bounded by its timeout.
#pragma once

#include <chrono>

namespace zest {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit Deadline(std::chrono::milliseconds timeout)
      : start_(Clock::now()), end_(start_ + timeout) {}

  bool passed() const { return Clock::now() >= end_; }
  // Time left, never negative.
  std::chrono::milliseconds remaining() const;
  std::chrono::microseconds remaining_us() const;
  std::chrono::milliseconds elapsed() const;

 private:
  Clock::time_point start_;
  Clock::time_point end_;
};

}  // namespace zest
