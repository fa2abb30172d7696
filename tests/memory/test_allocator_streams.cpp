// Blocks belong to their allocation stream; blocks used on other streams are
// reused only after those streams' work is done.
#include <doctest/doctest.h>

#include "memory/allocator_fixture.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("a block freed on one stream is not reused on another") {
  TestAllocator a;
  OwnedStream other(Device::host());
  void* p = a->allocate(4096, a.stream);
  a->free(p);
  void* q = a->allocate(4096, other);
  CHECK(q != p);
  CHECK(current(a->stats().segment) == 2);  // one small segment per stream
  void* r = a->allocate(4096, a.stream);
  CHECK(r == p);
  a->free(q);
  a->free(r);
  // Each stream's segment is whole and free again, and stays its stream's.
  const std::vector<SegmentInfo> snap = a->snapshot();
  REQUIRE(snap.size() == 2);
  CHECK(snap[0].stream_id != snap[1].stream_id);
}

TEST_CASE("record_stream defers reuse until the other stream's events complete") {
  TestAllocator a;
  OwnedStream comm(Device::host());
  void* p = a->allocate(1000, a.stream, MemoryCategory::kGradients);
  a->record_stream(p, comm);
  a->record_stream(p, comm);      // recorded once
  a->record_stream(p, a.stream);  // the allocation stream needs no event
  a->free(p);
  CHECK(a.events->recorded == 1);

  AllocatorStats s = a->stats();
  CHECK(s.num_deferred_frees == 1);
  CHECK(current(s.allocation) == 0);
  CHECK(current(s.allocated_bytes) == 0);
  CHECK(current(s.active) == 1);  // still in use by comm
  CHECK(current(s.active_bytes) == 1024);
  CHECK(s.category_requested(MemoryCategory::kGradients).current == 0);
  std::vector<SegmentInfo> snap = a->snapshot();
  REQUIRE(snap.size() == 1);
  CHECK(snap[0].blocks[0].state == BlockState::kPendingFree);
  CHECK(snap[0].active_size == 1024);
  CHECK(snap[0].allocated_size == 0);

  void* q = a->allocate(1000, a.stream);
  CHECK(q != p);  // p is still pending
  a.events->complete(comm);
  void* r = a->allocate(1000, a.stream);
  CHECK(r == p);  // reused once comm's work is done
  CHECK(a.events->released == 1);
  CHECK(a.events->synchronized == 0);  // the host never waited
  a->free(q);
  a->free(r);
  CHECK(current(a->stats().active) == 0);
}

TEST_CASE("a block used on two other streams waits for both") {
  TestAllocator a;
  OwnedStream s1(Device::host());
  OwnedStream s2(Device::host());
  void* p = a->allocate(size_t(MiB(12)), a.stream);
  a->record_stream(p, s1);
  a->record_stream(p, s2);
  a->free(p);
  CHECK(a.events->recorded == 2);
  a.events->complete(s1);
  void* q = a->allocate(size_t(MiB(12)), a.stream);
  CHECK(q != p);
  a.events->complete(s2);
  a->free(q);
  void* r = a->allocate(size_t(MiB(12)), a.stream);
  CHECK((r == p || r == q));
  CHECK(current(a->stats().active) == 1);
  a->free(r);
  CHECK(a.events->outstanding() == 0);
}

TEST_CASE("out of memory waits for pending frees before failing") {
  TestAllocator a(size_t(MiB(64)));
  OwnedStream comm(Device::host());
  void* p = a->allocate(size_t(MiB(40)), a.stream);
  a->record_stream(p, comm);
  a->free(p);
  // No room for a second 40 MiB segment: the allocator waits for comm, and
  // then p itself is free to reuse.
  void* q = a->allocate(size_t(MiB(40)), a.stream);
  CHECK(q == p);
  const AllocatorStats s = a->stats();
  CHECK(a.events->synchronized == 1);
  CHECK(s.num_sync_all_streams == 1);
  CHECK(s.num_alloc_retries == 1);
  CHECK(s.num_raw_allocs == 1);
  CHECK(s.num_ooms == 0);
  a->free(q);
}

TEST_CASE("empty_cache waits for pending frees and releases their segments") {
  TestAllocator a;
  OwnedStream comm(Device::host());
  void* p = a->allocate(size_t(MiB(16)), a.stream);
  a->record_stream(p, comm);
  a->free(p);
  a->empty_cache();
  CHECK(a.events->synchronized == 1);
  CHECK(current(a->stats().reserved_bytes) == 0);
  CHECK(current(a->stats().active) == 0);
}

TEST_CASE("with real host streams, a recorded stream's event completes at once") {
  CachingAllocator alloc(make_host_allocator(), AllocatorConfig{});
  OwnedStream compute(Device::host());
  OwnedStream comm(Device::host());
  void* p = alloc.allocate(2048, compute);
  alloc.record_stream(p, comm);
  alloc.free(p);
  CHECK(current(alloc.stats().active) == 1);  // until the next allocation looks
  void* q = alloc.allocate(2048, compute);
  CHECK(q == p);
  alloc.free(q);
}
