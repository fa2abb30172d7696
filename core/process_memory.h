// The process's resident memory as the operating system counts it.
//
// MemoryReport (engine.h) carries it beside what ZEST's allocators hold, so
// that the rest of a process's peak, which no allocator of ZEST's counts
// (libtorch's activations and its own allocator, the runtime's code, stacks
// and libraries), can be named and measured rather than guessed. Linux
// only (/proc/self/status); elsewhere the values are unknown.
#pragma once

#include <cstdint>

namespace zest {

struct ProcessMemory {
  int64_t rss = -1;       // resident bytes now (VmRSS); -1: unknown
  int64_t peak_rss = -1;  // the highest since the process began or reset_peak_rss() (VmHWM); -1: unknown
};

ProcessMemory process_memory();

// Starts the peak over from the resident set now (/proc/self/clear_refs),
// so that one phase of a run is measured alone. False where that cannot be
// done (not Linux, or the file is not writable): the peak then stays the
// process's.
bool reset_peak_rss();

}  // namespace zest
