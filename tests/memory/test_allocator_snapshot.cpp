// Snapshots describe every segment and block; the summary names the categories.
#include <doctest/doctest.h>

#include <algorithm>

#include "memory/allocator_fixture.h"

using namespace zest;
using namespace zest::test;

TEST_CASE("snapshot lists segments and their blocks in address order") {
  TestAllocator a;
  void* p = a->allocate(1000, a.stream, MemoryCategory::kParameters);
  void* q = a->allocate(5000, a.stream, MemoryCategory::kGradients);
  void* big = a->allocate(size_t(MiB(11)), a.stream, MemoryCategory::kMasterWeights);
  a->free(p);

  std::vector<SegmentInfo> snap = a->snapshot();
  REQUIRE(snap.size() == 2);
  std::sort(snap.begin(), snap.end(),
            [](const SegmentInfo& x, const SegmentInfo& y) { return x.total_size < y.total_size; });
  const SegmentInfo& small = snap[0];
  CHECK(small.is_small_pool);
  CHECK(small.total_size == size_t(MiB(2)));
  CHECK(small.address == reinterpret_cast<uintptr_t>(p));
  REQUIRE(small.blocks.size() == 3);
  CHECK(small.blocks[0].state == BlockState::kFree);
  CHECK(small.blocks[0].size == 1024);
  CHECK(small.blocks[1].state == BlockState::kAllocated);
  CHECK(small.blocks[1].size == 5120);
  CHECK(small.blocks[1].requested_size == 5000);
  CHECK(small.blocks[1].category == MemoryCategory::kGradients);
  CHECK(small.blocks[2].size == size_t(MiB(2)) - 1024 - 5120);
  CHECK(small.allocated_size == 5120);

  const SegmentInfo& large = snap[1];
  CHECK_FALSE(large.is_small_pool);
  CHECK(large.total_size == size_t(MiB(12)));
  REQUIRE(large.blocks.size() == 1);  // the 1 MiB rest is too small to split off
  CHECK(large.blocks[0].size == size_t(MiB(12)));
  CHECK(large.blocks[0].requested_size == size_t(MiB(11)));
  CHECK(large.blocks[0].category == MemoryCategory::kMasterWeights);

  size_t reserved = 0;
  size_t allocated = 0;
  for (const SegmentInfo& seg : snap) {
    reserved += seg.total_size;
    allocated += seg.allocated_size;
  }
  const AllocatorStats s = a->stats();
  CHECK(int64_t(reserved) == current(s.reserved_bytes));
  CHECK(int64_t(allocated) == current(s.allocated_bytes));
  a->free(q);
  a->free(big);
}

TEST_CASE("summary names device, totals and categories") {
  TestAllocator a;
  void* p = a->allocate(size_t(MiB(3)), a.stream, MemoryCategory::kOptimizerState);
  const std::string text = a->summary();
  CHECK(text.find("memory on host (limited)") != std::string::npos);
  CHECK(text.find("optimizer_state") != std::string::npos);
  CHECK(text.find("3.00 MiB") != std::string::npos);
  CHECK(text.find("20.00 MiB") != std::string::npos);  // reserved
  a->free(p);
}
