// The flat layout: offsets, groups, padding and shards, by hand.
#include <doctest/doctest.h>

#include "zest/core/check.h"
#include "zest/engine/layout.h"
#include "zest/engine/layout_constants.h"

using namespace zest;

namespace {

ModelLayout example(int partitions) {
  // Unit "u": w [10, 7] (70), b [10] no-decay, v [3] (default group again).
  // Placed group by group: w at 0, v at 128 (70 rounded up to 64s), then
  // b at 192 (128 + 3 rounded up); ends at 202.
  return ModelLayout({{"default", 0.1f}, {"no_decay", 0.0f}},
                     {{"u", {{"w", {10, 7}}, {"b", {10}, "no_decay"}, {"v", {3}}}}, {"s", {{"s.x", {}}}}},
                     partitions);
}

}  // namespace

TEST_CASE("parameters are placed group by group at 64-element offsets") {
  const ModelLayout L = example(1);
  const UnitLayout& u = L.unit(0);
  REQUIRE(u.params.size() == 3);
  CHECK(u.params[0].name == "w");
  CHECK(u.params[0].offset == 0);
  CHECK(u.params[1].name == "v");
  CHECK(u.params[1].offset == 128);
  CHECK(u.params[2].name == "b");
  CHECK(u.params[2].offset == 192);
  CHECK(u.numel == 83);
  CHECK(u.padded == 256);  // 202 up to a multiple of 1 x 256
  REQUIRE(u.runs.size() == 2);
  CHECK(u.runs[0].begin == 0);
  CHECK(u.runs[0].end == 192);
  CHECK(u.runs[0].group == 0);
  CHECK(u.runs[1].begin == 192);
  CHECK(u.runs[1].end == 256);
  CHECK(u.runs[1].group == 1);
  CHECK(L.unit(1).padded == 256);
  CHECK(L.numel() == 84);
  CHECK(L.padded() == 512);
}

TEST_CASE("units split into equal shards of whole chunks, runs follow the shards") {
  const ModelLayout L = example(3);
  const UnitLayout& u = L.unit(0);
  CHECK(u.padded == 768);  // 202 up to a multiple of 3 x 256
  CHECK(u.shard == 256);
  CHECK(u.shard % kShardQuantum == 0);
  CHECK(L.owned() == 512);
  CHECK(L.owned_offset(1) == 256);
  const std::vector<GroupRun> r0 = L.shard_runs(0, 0);
  REQUIRE(r0.size() == 2);
  CHECK(r0[0].end == 192);
  CHECK(r0[1].begin == 192);
  CHECK(r0[1].end == 256);
  const std::vector<GroupRun> r2 = L.shard_runs(0, 2);  // all padding, in the last group's run
  REQUIRE(r2.size() == 1);
  CHECK(r2[0].begin == 0);
  CHECK(r2[0].end == 256);
  CHECK(r2[0].group == 1);
}

TEST_CASE("describe, digest and the first difference") {
  const ModelLayout a = example(1);
  const ModelLayout b = example(4);
  CHECK(a.describe() == b.describe());  // the partition count is not the model
  CHECK(a.digest() == b.digest());
  const ModelLayout c({{"default", 0.1f}, {"no_decay", 0.0f}},
                      {{"u", {{"w", {10, 8}}, {"b", {10}, "no_decay"}, {"v", {3}}}}, {"s", {{"s.x", {}}}}}, 1);
  CHECK(a.digest() != c.digest());
  CHECK(first_difference(a.describe(), c.describe()) == "line 4: 'param w [10, 7] group default' against 'param w [10, 8] group default'");
  CHECK(a.find("b").unit == 0);
  CHECK_THROWS_WITH_AS(a.find("nope"), doctest::Contains("no parameter named 'nope'"), Error);
}
