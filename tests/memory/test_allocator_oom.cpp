// The out-of-memory path: free the cache and retry, then fail with numbers.
#include <doctest/doctest.h>

#include <string>

#include "memory/allocator_fixture.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("when the device is full, cached segments are released and the request retried") {
  TestAllocator a(size_t(MiB(64)));
  void* p = a->allocate(size_t(MiB(30)), a.stream);
  a->free(p);
  void* q = a->allocate(size_t(MiB(40)), a.stream);  // 30 cached + 40 > 64
  const AllocatorStats s = a->stats();
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_raw_frees == 1);
  CHECK(s.num_raw_allocs == 2);
  CHECK(s.num_ooms == 0);
  CHECK(current(s.reserved_bytes) == MiB(40));
  CHECK(peak(s.reserved_bytes) == MiB(40));
  a->free(q);
}

TEST_CASE("out of memory reports requested, capacity, free, allocated, reserved and largest block") {
  TestAllocator a(size_t(MiB(64)));
  // Three 20 MiB segments, each cut into five 4 MiB blocks; free every other
  // one: 24 MiB free in 4 MiB holes that cannot be returned.
  std::vector<void*> blocks;
  for (int i = 0; i < 15; ++i) blocks.push_back(a->allocate(size_t(MiB(4)), a.stream));
  CHECK(current(a->stats().reserved_bytes) == MiB(60));
  for (int i = 0; i < 15; ++i) {
    if (i % 5 == 1 || i % 5 == 3) a->free(blocks[i]);
  }
  std::string message;
  try {
    a->allocate(size_t(MiB(12)), a.stream, MemoryCategory::kWorkspace);
    FAIL("no error");
  } catch (const OutOfMemoryError& e) {
    message = e.message();
    CHECK(e.requested_bytes() == size_t(MiB(12)));
  }
  CHECK(message ==
        "out of memory on host (limited): tried to allocate 12.00 MiB for workspace (a 12.00 MiB "
        "segment). The device has 64.00 MiB in all and 4.00 MiB free; this allocator holds 60.00 "
        "MiB reserved, of which 36.00 MiB allocated and 24.00 MiB reserved but unallocated; the "
        "largest free cached block is 4.00 MiB (fragmentation 83%). Reserved but unallocated "
        "memory is large: setting ZEST_ALLOC_CONF=max_split_size_mb:N (N > 20) limits "
        "fragmentation.");
  const AllocatorStats s = a->stats();
  CHECK(s.num_ooms == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(current(s.allocated_bytes) == MiB(36));  // nothing changed by the failure
  CHECK(current(s.reserved_bytes) == MiB(60));
  // The allocator is still usable: a 4 MiB request takes a hole.
  void* hole = a->allocate(size_t(MiB(4)), a.stream);
  bool is_hole = false;
  for (int i = 0; i < 15; ++i) is_hole |= (i % 5 == 1 || i % 5 == 3) && hole == blocks[i];
  CHECK(is_hole);
  a->free(hole);
  for (int i = 0; i < 15; ++i) {
    if (i % 5 != 1 && i % 5 != 3) a->free(blocks[i]);
  }
}

TEST_CASE("out of memory without fragmentation suggests sharding more") {
  TestAllocator a(size_t(MiB(64)));
  void* p = a->allocate(size_t(MiB(50)), a.stream, MemoryCategory::kOptimizerState);
  CHECK_THROWS_WITH_AS(a->allocate(size_t(MiB(20)), a.stream),
                       doctest::Contains("use a higher ZeRO stage or more ranks"), OutOfMemoryError);
  void* q = a->allocate(size_t(MiB(10)), a.stream);  // what fits still works
  a->free(q);
  a->free(p);
}

TEST_CASE("empty_cache returns every whole free segment") {
  TestAllocator a;
  void* keep = a->allocate(100, a.stream);
  void* x = a->allocate(size_t(MiB(12)), a.stream);
  void* y = a->allocate(size_t(MiB(3)), a.stream);
  a->free(x);
  a->free(y);
  CHECK(current(a->stats().reserved_bytes) == MiB(2 + 12 + 20));
  a->empty_cache();
  const AllocatorStats s = a->stats();
  CHECK(current(s.reserved_bytes) == MiB(2));  // the segment in use stays
  CHECK(s.num_raw_frees == 2);
  a->free(keep);
  a->empty_cache();
  CHECK(current(a->stats().reserved_bytes) == 0);
}
