#include <doctest/doctest.h>

#include "zest/core/units.h"
#include "zest/memory/allocator_config.h"
#include "zest/core/check.h"

using zest::AllocatorConfig;

TEST_CASE("ZEST_ALLOC_CONF options parse") {
  CHECK(AllocatorConfig::parse("").max_split_size == SIZE_MAX);
  CHECK(AllocatorConfig::parse("max_split_size_mb:128").max_split_size == 128 * zest::kMiB);
  CHECK(AllocatorConfig::parse(" max_split_size_mb : 21 ,").max_split_size == 21 * zest::kMiB);
}

TEST_CASE("bad allocator options name the problem") {
  CHECK_THROWS_WITH_AS(AllocatorConfig::parse("max_split_size_mb:20"),
                       doctest::Contains("must be more than 20"), zest::Error);
  CHECK_THROWS_WITH_AS(AllocatorConfig::parse("max_split_size_mb:lots"),
                       doctest::Contains("needs a whole number of MiB, got 'lots'"), zest::Error);
  CHECK_THROWS_WITH_AS(AllocatorConfig::parse("max_split_size_mb"), doctest::Contains("has no value"),
                       zest::Error);
  CHECK_THROWS_WITH_AS(AllocatorConfig::parse("expandable_segments:True"),
                       doctest::Contains("unknown allocator option 'expandable_segments'"),
                       zest::Error);
  CHECK_THROWS_AS(AllocatorConfig::parse("max_split_size_mb:99999999999999999999"), zest::Error);
}
