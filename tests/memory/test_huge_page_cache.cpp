// HugePageCache: whole huge pages, reuse of a freed size, the high-water
// bound on what it keeps, the advice the kernel gets, and many threads.
#include <doctest/doctest.h>

#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "zest/memory/huge_page_cache.h"

namespace test_huge_page_cache {

using namespace zest;

namespace {

constexpr size_t kMiB = size_t{1} << 20;

bool aligned(void* p) { return reinterpret_cast<uintptr_t>(p) % HugePageCache::kHugePage == 0; }

// The VmFlags line of the mapping in /proc/self/smaps that holds `p`.
std::string vm_flags_of(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;
    } else if (inside && line.starts_with("VmFlags:")) {
      return line;
    }
  }
  return {};
}

}  // namespace

TEST_CASE("huge page cache: blocks are whole huge pages, aligned to one") {
  CHECK(HugePageCache::block_size(1) == 2 * kMiB);
  CHECK(HugePageCache::block_size(2 * kMiB) == 2 * kMiB);
  CHECK(HugePageCache::block_size(2 * kMiB + 1) == 4 * kMiB);
  CHECK(HugePageCache::block_size(SIZE_MAX) == 0);  // no such block: allocate() says nullptr
  HugePageCache cache;
  CHECK(cache.allocate(SIZE_MAX) == nullptr);
  void* a = cache.allocate(3 * kMiB);
  REQUIRE(a != nullptr);
  CHECK(aligned(a));
  std::memset(a, 0x5a, 4 * kMiB);  // the whole rounded block is ours to write
  HugePageCache::Stats s = cache.stats();
  CHECK(s.in_use_bytes == 4 * kMiB);
  CHECK(s.peak_in_use_bytes == 4 * kMiB);
  CHECK(s.misses == 1);
  CHECK(s.hits == 0);
  cache.deallocate(a);
  s = cache.stats();
  CHECK(s.in_use_bytes == 0);
  CHECK(s.idle_bytes == 4 * kMiB);
}

TEST_CASE("huge page cache: a freed block serves the next request of its size") {
  HugePageCache cache;
  void* a = cache.allocate(5 * kMiB);  // 6 MiB
  void* b = cache.allocate(2 * kMiB);
  REQUIRE((a != nullptr && b != nullptr));
  cache.deallocate(a);
  void* c = cache.allocate(6 * kMiB - 100);  // the same 6 MiB block
  CHECK(c == a);
  void* d = cache.allocate(2 * kMiB);  // b is in use: a new block
  CHECK(d != b);
  const HugePageCache::Stats s = cache.stats();
  CHECK(s.hits == 1);
  CHECK(s.misses == 3);
  CHECK(s.in_use_bytes == 10 * kMiB);
  CHECK(s.idle_bytes == 0);
  for (void* p : {b, c, d}) cache.deallocate(p);
  CHECK(cache.stats().idle_bytes == 10 * kMiB);
  cache.release_idle();
  CHECK(cache.stats().idle_bytes == 0);
}

TEST_CASE("huge page cache: what it keeps never takes it past its peak in use") {
  HugePageCache cache;
  void* a = cache.allocate(4 * kMiB);
  void* b = cache.allocate(4 * kMiB);
  cache.deallocate(a);  // least recently freed
  cache.deallocate(b);
  HugePageCache::Stats s = cache.stats();
  CHECK(s.peak_in_use_bytes == 8 * kMiB);
  CHECK(s.idle_bytes == 8 * kMiB);

  // 2 MiB more would hold 10 MiB against a peak of 8: a's block goes.
  void* c = cache.allocate(2 * kMiB);
  s = cache.stats();
  CHECK(s.evictions == 1);
  CHECK(s.idle_bytes == 4 * kMiB);
  CHECK(s.in_use_bytes == 2 * kMiB);
  CHECK(s.in_use_bytes + s.idle_bytes <= s.peak_in_use_bytes);
  void* d = cache.allocate(4 * kMiB);  // b's block, kept
  CHECK(d == b);
  CHECK(cache.stats().hits == 1);

  // Past the peak nothing idle is left to evict: the peak grows instead.
  void* e = cache.allocate(8 * kMiB);
  s = cache.stats();
  CHECK(s.in_use_bytes == 14 * kMiB);
  CHECK(s.peak_in_use_bytes == 14 * kMiB);
  CHECK(s.evictions == 1);
  for (void* p : {c, d, e}) cache.deallocate(p);
}

TEST_CASE("huge page cache: blocks are advised as huge pages where the kernel has them") {
  struct stat st {};
  if (::stat("/sys/kernel/mm/transparent_hugepage", &st) != 0) {
    // A kernel without THP refuses the advice; the block still serves.
    MESSAGE("no transparent huge pages in this kernel: only the mapping is checked");
  }
  HugePageCache cache;
  void* a = cache.allocate(4 * kMiB);
  REQUIRE(a != nullptr);
  const std::string flags = vm_flags_of(a);
  REQUIRE_MESSAGE(!flags.empty(), "no mapping in /proc/self/smaps holds the block");
  if (::stat("/sys/kernel/mm/transparent_hugepage", &st) == 0) {
    CHECK_MESSAGE(flags.find(" hg") != std::string::npos, "the block's mapping lacks MADV_HUGEPAGE: " << flags);
  }
  cache.deallocate(a);
}

TEST_CASE("huge page cache: a block it did not hand out is refused, not taken") {
  HugePageCache cache;
  int local = 0;
  cache.deallocate(&local);  // logged as an error
  cache.deallocate(nullptr);
  const HugePageCache::Stats s = cache.stats();
  CHECK(s.idle_bytes == 0);
  CHECK(s.in_use_bytes == 0);
}

TEST_CASE("huge page cache: threads allocating and freeing keep the books") {
  HugePageCache cache;
  constexpr int kThreads = 4;
  constexpr int kRounds = 200;
  std::atomic<int> failed{0};  // doctest's assertions stay on the test's thread
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&cache, &failed, t] {
      std::vector<void*> mine;
      for (int r = 0; r < kRounds; ++r) {
        const size_t bytes = static_cast<size_t>(1 + (r + t) % 3) * 2 * kMiB;
        void* p = cache.allocate(bytes);
        if (p == nullptr) {
          ++failed;
          break;
        }
        static_cast<unsigned char*>(p)[bytes - 1] = static_cast<unsigned char>(r);
        mine.push_back(p);
        if (mine.size() > 2) {
          cache.deallocate(mine.front());
          mine.erase(mine.begin());
        }
      }
      for (void* p : mine) cache.deallocate(p);
    });
  }
  for (std::thread& t : threads) t.join();
  REQUIRE(failed == 0);
  const HugePageCache::Stats s = cache.stats();
  CHECK(s.in_use_bytes == 0);
  CHECK(s.hits + s.misses == kThreads * kRounds);
  CHECK(s.hits > 0);
  // At most 3 blocks of at most 6 MiB a thread at once.
  CHECK(s.peak_in_use_bytes <= size_t{kThreads} * 3 * 6 * kMiB);
  CHECK(s.idle_bytes <= s.peak_in_use_bytes);
}

}  // namespace test_huge_page_cache
