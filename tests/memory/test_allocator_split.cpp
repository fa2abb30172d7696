// Best fit, splitting rules, coalescing, and max_split_size.
#include <doctest/doctest.h>

#include "memory/allocator_fixture.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("best fit picks the smallest free block that is big enough") {
  TestAllocator a;
  // One 2 MiB segment: [a 100K][b 10K][c 50K][d 10K][e 200K][rest]
  void* pa = a->allocate(size_t(KiB(100)), a.stream);
  void* pb = a->allocate(size_t(KiB(10)), a.stream);
  void* pc = a->allocate(size_t(KiB(50)), a.stream);
  void* pd = a->allocate(size_t(KiB(10)), a.stream);
  void* pe = a->allocate(size_t(KiB(200)), a.stream);
  CHECK(offset(pa, pb) == KiB(100));
  CHECK(offset(pa, pe) == KiB(170));
  a->free(pa);
  a->free(pc);  // holes of 100K and 50K, kept apart by b and d

  void* x = a->allocate(size_t(KiB(40)), a.stream);
  CHECK(x == pc);  // 50K hole, not the 100K one or the tail
  void* y = a->allocate(size_t(KiB(60)), a.stream);
  CHECK(y == pa);  // 100K hole; leaves a 40K hole
  void* z = a->allocate(size_t(KiB(60)), a.stream);
  CHECK(offset(pa, z) == KiB(370));  // the 40K and 10K holes are too small: the tail
  void* w = a->allocate(size_t(KiB(40)), a.stream);
  CHECK(offset(pa, w) == KiB(60));  // exactly the 40K hole left by y

  const AllocatorStats s = a->stats();
  CHECK(current(s.segment) == 1);
  CHECK(s.num_raw_allocs == 1);
  for (void* p : {pb, pd, pe, x, y, z, w}) a->free(p);
  CHECK(current(a->stats().inactive_split) == 0);
}

TEST_CASE("small pool splits off a rest of exactly 512 bytes") {
  TestAllocator a;
  void* p = a->allocate(size_t(MiB(1)), a.stream);
  void* q = a->allocate(size_t(MiB(1)) - 512, a.stream);
  AllocatorStats s = a->stats();
  CHECK(current(s.allocated_bytes) == MiB(2) - 512);
  CHECK(current(s.inactive_split) == 1);
  CHECK(current(s.inactive_split_bytes) == 512);
  void* r = a->allocate(100, a.stream);
  CHECK(offset(p, r) == MiB(2) - 512);  // the last 512 bytes
  s = a->stats();
  CHECK(current(s.segment) == 1);
  CHECK(current(s.inactive_split) == 0);
  for (void* x : {p, q, r}) a->free(x);
}

TEST_CASE("large pool splits only when more than 1 MiB would remain") {
  TestAllocator a;
  // 9 MiB from a 20 MiB segment leaves 11 MiB: split.
  void* p = a->allocate(size_t(MiB(9)), a.stream);
  CHECK(current(a->stats().allocated_bytes) == MiB(9));
  // 10 MiB of the 11 MiB rest would leave exactly 1 MiB: not split, the
  // whole 11 MiB block is handed out.
  void* q = a->allocate(size_t(MiB(10)), a.stream);
  CHECK(offset(p, q) == MiB(9));
  const AllocatorStats s = a->stats();
  CHECK(current(s.allocated_bytes) == MiB(20));
  CHECK(current(s.requested_bytes) == MiB(19));
  CHECK(current(s.inactive_split) == 0);
  CHECK(current(s.segment) == 1);
  a->free(p);
  a->free(q);
}

TEST_CASE("freed blocks coalesce with free neighbours in any order") {
  for (int order = 0; order < 6; ++order) {
    CAPTURE(order);
    TestAllocator a;
    void* blocks[3];
    for (void*& b : blocks) b = a->allocate(size_t(KiB(64)), a.stream);
    void* tail_user = a->allocate(size_t(KiB(64)), a.stream);  // keeps the tail separate
    static constexpr int kOrders[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2},
                                          {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int i : kOrders[order]) a->free(blocks[i]);
    // The three blocks are one free 192K block now: a 192K request fits there.
    void* big = a->allocate(size_t(KiB(192)), a.stream);
    CHECK(big == blocks[0]);
    const std::vector<SegmentInfo> snap = a->snapshot();
    REQUIRE(snap.size() == 1);
    REQUIRE(snap[0].blocks.size() == 3);  // [192K][64K][rest]
    CHECK(snap[0].blocks[0].size == size_t(KiB(192)));
    CHECK(snap[0].blocks[2].state == BlockState::kFree);
    a->free(big);
    a->free(tail_user);
    CHECK(a->snapshot()[0].blocks.size() == 1);
  }
}

TEST_CASE("max_split_size keeps large cached blocks whole") {
  AllocatorConfig cfg;
  cfg.max_split_size = size_t(MiB(40));
  TestAllocator a(size_t(MiB(512)), cfg);

  void* big = a->allocate(size_t(MiB(60)), a.stream);
  a->free(big);
  // Below max_split_size: the cached 60 MiB block is not split for it.
  void* mid = a->allocate(size_t(MiB(30)), a.stream);
  CHECK(mid != big);
  CHECK(current(a->stats().reserved_bytes) == MiB(90));
  // At or above max_split_size and within 20 MiB of the block: reused whole.
  void* again = a->allocate(size_t(MiB(50)), a.stream);
  CHECK(again == big);
  CHECK(current(a->stats().allocated_bytes) == MiB(90));
  a->free(again);
  // A request 20 MiB or more below the cached block's size does not take it.
  void* small_big = a->allocate(size_t(MiB(40)), a.stream);
  CHECK(small_big != big);
  a->free(small_big);
  a->free(mid);
}

TEST_CASE("max_split_size prevents the fragmentation that makes a refill fail") {
  // A 64 MiB device. The loop needs a 40 MiB buffer, a 4 MiB one, then the
  // 40 MiB one again.
  auto run = [](AllocatorConfig cfg) {
    TestAllocator a(size_t(MiB(64)), cfg);
    a->allocate_buffer(size_t(MiB(40)), a.stream).reset();
    // A Buffer, so that the failure below still returns it before `a` goes.
    Buffer small = a->allocate_buffer(size_t(MiB(4)), a.stream);
    a->allocate_buffer(size_t(MiB(40)), a.stream).reset();
  };
  // Unlimited: the 4 MiB request splits the cached 40 MiB block, which can then
  // never be released or hold 40 MiB again.
  CHECK_THROWS_WITH_AS(run(AllocatorConfig{}), doctest::Contains("reserved but unallocated"),
                       OutOfMemoryError);
  AllocatorConfig cfg;
  cfg.max_split_size = size_t(MiB(30));
  CHECK_NOTHROW(run(cfg));
}
