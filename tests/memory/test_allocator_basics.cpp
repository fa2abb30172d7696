// Size classes, stats after scripted sequences, categories and bad requests.
#include <doctest/doctest.h>

#include "memory/allocator_fixture.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("a small request carves a 2 MiB segment, freeing caches it") {
  TestAllocator a;
  void* p = a->allocate(1000, a.stream, MemoryCategory::kGradients);
  AllocatorStats s = a->stats();
  CHECK(current(s.allocation) == 1);
  CHECK(current(s.requested_bytes) == 1000);
  CHECK(current(s.allocated_bytes) == 1024);
  CHECK(current(s.reserved_bytes) == MiB(2));
  CHECK(current(s.reserved_bytes, StatPool::kSmall) == MiB(2));
  CHECK(current(s.reserved_bytes, StatPool::kLarge) == 0);
  CHECK(current(s.segment) == 1);
  CHECK(current(s.active_bytes) == 1024);
  CHECK(current(s.inactive_split) == 1);
  CHECK(current(s.inactive_split_bytes) == MiB(2) - 1024);
  CHECK(s.num_raw_allocs == 1);

  a->free(p);
  s = a->stats();
  CHECK(current(s.allocation) == 0);
  CHECK(current(s.allocated_bytes) == 0);
  CHECK(current(s.active) == 0);
  CHECK(current(s.reserved_bytes) == MiB(2));  // cached, not returned
  CHECK(current(s.inactive_split) == 0);       // merged back into one whole block
  CHECK(at(s.allocated_bytes, StatPool::kAggregate).allocated == 1024);
  CHECK(at(s.allocated_bytes, StatPool::kAggregate).freed == 1024);

  void* q = a->allocate(900, a.stream);
  CHECK(q == p);  // served from the cache
  CHECK(a->stats().num_raw_allocs == 1);
  a->free(q);
}

TEST_CASE("sizes round to 512 bytes and pick the segment size of their class") {
  struct Case {
    size_t request;
    int64_t block;
    int64_t segment;
    bool small;
  };
  const Case cases[] = {
      {1, 512, MiB(2), true},
      {512, 512, MiB(2), true},
      {513, 1024, MiB(2), true},
      {size_t(MiB(1)), MiB(1), MiB(2), true},
      {size_t(MiB(1)) + 1, MiB(1) + 512, MiB(20), false},
      {size_t(MiB(9.5)), MiB(9.5), MiB(20), false},
      {size_t(MiB(10)), MiB(10), MiB(10), false},
      {size_t(MiB(10)) + 1, MiB(10) + 512, MiB(12), false},
      {size_t(MiB(19)), MiB(20), MiB(20), false},  // the 1 MiB rest is too small to split off
  };
  for (const Case& c : cases) {
    CAPTURE(c.request);
    TestAllocator a;
    void* p = a->allocate(c.request, a.stream);
    const AllocatorStats s = a->stats();
    CHECK(current(s.allocated_bytes) == c.block);
    CHECK(current(s.reserved_bytes) == c.segment);
    CHECK(current(s.reserved_bytes, c.small ? StatPool::kSmall : StatPool::kLarge) == c.segment);
    CHECK(current(s.requested_bytes) == int64_t(c.request));
    a->free(p);
  }
}

TEST_CASE("peaks, totals and reset_peak_stats") {
  TestAllocator a;
  void* x = a->allocate(size_t(MiB(3)), a.stream);
  void* y = a->allocate(size_t(MiB(5)), a.stream);
  a->free(x);
  void* z = a->allocate(size_t(MiB(1)), a.stream);  // small pool
  AllocatorStats s = a->stats();
  CHECK(current(s.allocated_bytes) == MiB(6));
  CHECK(peak(s.allocated_bytes) == MiB(8));
  CHECK(at(s.allocated_bytes, StatPool::kAggregate).allocated == MiB(9));
  CHECK(peak(s.allocation) == 2);
  a->reset_peak_stats();
  CHECK(peak(a->stats().allocated_bytes) == MiB(6));
  a->free(y);
  a->free(z);
  s = a->stats();
  CHECK(current(s.allocated_bytes) == 0);
  CHECK(peak(s.allocated_bytes) == MiB(6));
}

TEST_CASE("every allocation is counted under its category") {
  TestAllocator a;
  void* p1 = a->allocate(1000, a.stream, MemoryCategory::kParameters);
  void* p2 = a->allocate(3000, a.stream, MemoryCategory::kParameters);
  void* m = a->allocate(4000, a.stream, MemoryCategory::kMasterWeights);
  void* o = a->allocate(size_t(MiB(12)), a.stream, MemoryCategory::kOptimizerState);
  AllocatorStats s = a->stats();
  CHECK(s.category_requested(MemoryCategory::kParameters).current == 4000);
  CHECK(s.category_allocated(MemoryCategory::kParameters).current == 1024 + 3072);
  CHECK(s.category_requested(MemoryCategory::kMasterWeights).current == 4000);
  CHECK(s.category_requested(MemoryCategory::kOptimizerState).current == MiB(12));
  CHECK(s.category_requested(MemoryCategory::kGradients).current == 0);
  int64_t sum = 0;
  for (MemoryCategory c : kAllMemoryCategories) sum += s.category_requested(c).current;
  CHECK(sum == current(s.requested_bytes));

  a->free(p1);
  a->free(o);
  s = a->stats();
  CHECK(s.category_requested(MemoryCategory::kParameters).current == 3000);
  CHECK(s.category_requested(MemoryCategory::kParameters).peak == 4000);
  CHECK(s.category_requested(MemoryCategory::kOptimizerState).current == 0);
  CHECK(s.category_requested(MemoryCategory::kOptimizerState).peak == MiB(12));
  a->free(p2);
  a->free(m);
}

TEST_CASE("Buffer returns its memory when it goes out of scope or moves") {
  TestAllocator a;
  {
    Buffer b = a->allocate_buffer(4096, a.stream, MemoryCategory::kWorkspace);
    CHECK(b.size_bytes() == 4096);
    CHECK(current(a->stats().allocation) == 1);
    Buffer c = std::move(b);
    CHECK_FALSE(b);
    CHECK(c.as<float>() != nullptr);
    CHECK(current(a->stats().allocation) == 1);
  }
  CHECK(current(a->stats().allocation) == 0);
}

TEST_CASE("bad requests get clear errors and change nothing") {
  TestAllocator a;
  CHECK_THROWS_WITH_AS(a->allocate(0, a.stream, MemoryCategory::kGradients),
                       doctest::Contains("allocation of 0 bytes requested for gradients on host"),
                       Error);
  CHECK_THROWS_WITH_AS(a->allocate(SIZE_MAX, a.stream),
                       doctest::Contains("is larger than any device"), Error);
  CHECK_THROWS_WITH_AS(a->allocate(size_t(-64), a.stream),
                       doctest::Contains("probably a negative number"), Error);
  int local = 0;
  CHECK_THROWS_WITH_AS(a->free(&local), doctest::Contains("did not hand out or which was already freed"),
                       Error);
  void* p = a->allocate(100, a.stream);
  a->free(p);
  CHECK_THROWS_WITH_AS(a->free(p), doctest::Contains("already freed"), Error);
  CHECK_THROWS_WITH_AS(a->record_stream(p, a.stream), doctest::Contains("not a live allocation"),
                       Error);
  a->free(nullptr);  // like std::free
  const AllocatorStats s = a->stats();
  CHECK(s.num_ooms == 0);
  CHECK(current(s.allocation) == 0);
  CHECK(current(s.reserved_bytes) == MiB(2));
}

TEST_CASE("an impossible request on the real host allocator is an out-of-memory error") {
  CachingAllocator a(make_host_allocator(), AllocatorConfig{});
  const Stream s = Stream::default_for(Device::host());
  CHECK_THROWS_WITH_AS(a.allocate(size_t{1} << 52, s), doctest::Contains("out of memory on host"),
                       OutOfMemoryError);
  CHECK(a.stats().num_ooms == 1);
  void* p = a.allocate(64, s);  // still usable
  a.free(p);
}
