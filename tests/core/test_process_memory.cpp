// process_memory() and reset_peak_rss(): the resident set and its peak as
// the operating system counts them.
#include <doctest/doctest.h>

#include <sys/mman.h>

#include <cstring>

#include "zest/core/process_memory.h"

using namespace zest;

TEST_CASE("process memory: the peak follows 64 MiB touched, and a reset brings it back") {
#ifndef __linux__
  CHECK(process_memory().peak_rss == -1);
#else
  const ProcessMemory before = process_memory();
  REQUIRE(before.rss > 0);
  CHECK(before.peak_rss >= before.rss);
  constexpr size_t kBytes = size_t{64} << 20;
  {
    // A mapping of its own, unmapped at the end, whatever the heap does
    // with freed blocks (a sanitizer's heap keeps them in quarantine).
    void* p = ::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    REQUIRE(p != MAP_FAILED);
    char* block = static_cast<char*>(p);
    std::memset(block, 1, kBytes);  // resident only once written
    const ProcessMemory held = process_memory();
    CHECK(held.rss >= before.rss + static_cast<int64_t>(kBytes) - (int64_t{4} << 20));
    CHECK(held.peak_rss >= held.rss);
    // Read while the block is live, so it cannot be optimized away.
    CHECK(block[kBytes - 1] == 1);
    REQUIRE(::munmap(p, kBytes) == 0);
  }
  const ProcessMemory after = process_memory();
  CHECK(after.peak_rss >= before.rss + static_cast<int64_t>(kBytes) - (int64_t{4} << 20));
  if (reset_peak_rss()) {
    // The block went back to the system: the new peak is about what is
    // resident now.
    const ProcessMemory reset = process_memory();
    CHECK(reset.peak_rss < after.peak_rss - static_cast<int64_t>(kBytes) / 2);
    CHECK(reset.peak_rss >= reset.rss);
  }
#endif
}
