#include <doctest/doctest.h>

#include <string>

#include "zest/core/check.h"
#include "zest/core/rank_context.h"

namespace {
int checked_divide(int a, int b) {
  ZEST_CHECK(b != 0, "cannot divide {} by zero; pass a non-zero divisor", a);
  return a / b;
}
}  // namespace

TEST_CASE("ZEST_CHECK throws zest::Error with the message, the file and the line") {
  CHECK(checked_divide(6, 3) == 2);
  try {
    checked_divide(7, 0);
    FAIL("no error");
  } catch (const zest::Error& e) {
    CHECK(e.message() == "cannot divide 7 by zero; pass a non-zero divisor");
    CHECK(std::string(e.file()) == "tests/core/test_check.cpp");
    CHECK(e.line() == 10);
    CHECK(std::string(e.what()) ==
          "cannot divide 7 by zero; pass a non-zero divisor (tests/core/test_check.cpp:10)");
  }
}

TEST_CASE("errors name the rank of the thread that raised them") {
  zest::ScopedRank rank(3, 4);
  try {
    ZEST_FAIL("bad thing {}", 1);
  } catch (const zest::Error& e) {
    CHECK(std::string(e.what()).starts_with("[rank 3] bad thing 1 (tests/core/test_check.cpp:"));
  }
}

TEST_CASE("ScopedRank restores the previous thread rank") {
  zest::clear_thread_rank();
  const zest::RankContext before = zest::this_rank();
  {
    zest::ScopedRank outer(1, 2);
    {
      zest::ScopedRank inner(5, 8);
      CHECK(zest::this_rank().rank == 5);
      CHECK(zest::this_rank().world_size == 8);
    }
    CHECK(zest::this_rank().rank == 1);
  }
  CHECK(zest::this_rank().rank == before.rank);
}

TEST_CASE("ZEST_INTERNAL_ASSERT is always on and says it is a bug") {
  const int x = 2;
  CHECK_NOTHROW(ZEST_INTERNAL_ASSERT(x == 2));
  try {
    ZEST_INTERNAL_ASSERT(x == 3, "x was {}", x);
    FAIL("no error");
  } catch (const zest::Error& e) {
    CHECK(e.message() == "internal error in ZEST: `x == 3` does not hold: x was 2; this is a bug "
                         "in ZEST, please report it with this message");
  }
  CHECK_THROWS_AS(ZEST_INTERNAL_ASSERT(x < 0), zest::Error);
}
