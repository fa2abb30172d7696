#include "zest/core/process_memory.h"

#include <cstdio>
#include <cstring>

namespace zest {
namespace {

// "VmRSS:     1234 kB" -> bytes, or -1 when the line is not one of those.
int64_t kib_line(const char* line, const char* key) {
  const size_t n = std::strlen(key);
  if (std::strncmp(line, key, n) != 0 || line[n] != ':') return -1;
  long long kib = 0;
  if (std::sscanf(line + n + 1, "%lld", &kib) != 1 || kib < 0) return -1;
  return static_cast<int64_t>(kib) * 1024;
}

}  // namespace

ProcessMemory process_memory() {
  ProcessMemory m;
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return m;  // not Linux: unknown, which the fields say
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    if (const int64_t v = kib_line(line, "VmRSS"); v >= 0) m.rss = v;
    if (const int64_t v = kib_line(line, "VmHWM"); v >= 0) m.peak_rss = v;
  }
  std::fclose(f);  // read-only: nothing to lose if it fails
  return m;
}

bool reset_peak_rss() {
  std::FILE* f = std::fopen("/proc/self/clear_refs", "w");
  if (f == nullptr) return false;
  // 5: reset the peak resident set size to the current one (proc(5)).
  const bool written = std::fputs("5", f) >= 0;
  return std::fclose(f) == 0 && written;
}

}  // namespace zest
