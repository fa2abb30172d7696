// Several threads allocate and free at once, on their own streams and a shared
// one, writing a signature into every block: any overlap between live blocks
// or any lost update in the shared state shows up as a wrong signature or a
// stat that does not return to zero.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "memory/allocator_fixture.h"

using namespace zest;
using namespace zest::test;

namespace {

struct Live {
  uint64_t* ptr;
  size_t size;
  uint64_t tag;
};

// Writes the tag every 4 KiB (every page) and at the end.
void sign(const Live& l) {
  const size_t words = l.size / sizeof(uint64_t);
  for (size_t i = 0; i < words; i += 512) l.ptr[i] = l.tag;
  l.ptr[words - 1] = l.tag;
}

bool verify(const Live& l) {
  const size_t words = l.size / sizeof(uint64_t);
  for (size_t i = 0; i < words; i += 512) {
    if (l.ptr[i] != l.tag) return false;
  }
  return l.ptr[words - 1] == l.tag;
}

}  // namespace

TEST_CASE("concurrent allocation and free from many threads") {
  CachingAllocator alloc(make_limited_allocator(make_host_allocator(), 2 * kGiB), AllocatorConfig{});
  OwnedStream shared(Device::host());
  constexpr int kThreads = 4;
  constexpr int kIterations = 20000;
  std::atomic<int> corrupted{0};
  std::atomic<int> ooms{0};

  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      OwnedStream own(Device::host());
      std::mt19937_64 rng(1234 + t);
      std::vector<Live> live;
      for (int i = 0; i < kIterations; ++i) {
        const bool do_alloc = live.empty() || (live.size() < 48 && rng() % 100 < 55);
        if (do_alloc) {
          // Mostly small, sometimes 1-10 MiB, rarely a segment of its own.
          const uint64_t r = rng() % 1000;
          size_t size = r < 900 ? 8 + rng() % (64 * kKiB) : r < 995 ? kMiB + rng() % (9 * kMiB) : 10 * kMiB + rng() % (6 * kMiB);
          size = round_up(size, sizeof(uint64_t));
          const bool on_own = (rng() & 1) != 0;
          const Stream s = on_own ? own.get() : shared.get();
          const auto category = kAllMemoryCategories[rng() % kNumMemoryCategories];
          try {
            auto* p = static_cast<uint64_t*>(alloc.allocate(size, s, category));
            Live l{p, size, (uint64_t(t) << 48) | uint64_t(i)};
            sign(l);
            live.push_back(l);
            if (rng() % 8 == 0) alloc.record_stream(p, on_own ? shared.get() : own.get());
          } catch (const OutOfMemoryError&) {
            ++ooms;
          }
        } else {
          const size_t k = rng() % live.size();
          if (!verify(live[k])) ++corrupted;
          alloc.free(live[k].ptr);
          live[k] = live.back();
          live.pop_back();
        }
      }
      for (const Live& l : live) {
        if (!verify(l)) ++corrupted;
        alloc.free(l.ptr);
      }
    });
  }
  for (auto& th : threads) th.join();

  CHECK(corrupted.load() == 0);
  CHECK(ooms.load() == 0);  // the live set stays near 100 MiB, far below 2 GiB
  const AllocatorStats s = alloc.stats();
  CHECK(current(s.allocation) == 0);
  CHECK(current(s.allocated_bytes) == 0);
  CHECK(current(s.requested_bytes) == 0);
  for (MemoryCategory c : kAllMemoryCategories) CHECK(s.category_requested(c).current == 0);
  CHECK(at(s.allocation, StatPool::kAggregate).allocated > kThreads * kIterations / 3);

  // Everything is cached and whole again once pending frees are processed.
  alloc.empty_cache();
  const AllocatorStats after = alloc.stats();
  CHECK(current(after.active) == 0);
  CHECK(current(after.reserved_bytes) == 0);
  CHECK(current(after.inactive_split) == 0);
  CHECK(after.num_raw_allocs == after.num_raw_frees);
}
