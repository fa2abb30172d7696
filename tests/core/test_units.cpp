#include <doctest/doctest.h>

#include "zest/core/units.h"

TEST_CASE("format_bytes picks a binary unit with two decimals") {
  CHECK(zest::format_bytes(0) == "0 B");
  CHECK(zest::format_bytes(512) == "512 B");
  CHECK(zest::format_bytes(1536) == "1.50 KiB");
  CHECK(zest::format_bytes(20 * 1024 * 1024) == "20.00 MiB");
  CHECK(zest::format_bytes(int64_t{3} << 30) == "3.00 GiB");
  CHECK(zest::format_bytes(-2048) == "-2.00 KiB");
  CHECK(zest::round_up(1, 512) == 512);
  CHECK(zest::round_up(1024, 512) == 1024);
}
