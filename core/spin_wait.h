// Waiting for another thread or process without sleeping, for a bounded
// time: a hand-off that completes within microseconds is seen within
// nanoseconds of it, where a sleep would cost tens of microseconds.
#pragma once

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace zest {

// Tells the CPU this is a spin loop: on x86 the pause instruction, which
// saves power and lets a hyperthread sibling run.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

// Calls done() until it returns true (then true) or `budget` has passed
// (then false, after one last call). The clock is read every few polls only.
template <typename Done>
bool spin_until(std::chrono::microseconds budget, Done&& done) {
  if (done()) return true;
  if (budget.count() <= 0) return false;
  const auto end = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    if (std::chrono::steady_clock::now() >= end) return done();
  }
}

}  // namespace zest
