// The doctest main shared by the host test executables.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "ran_tests.h"

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  return zest_test::fail_if_none_ran(rc);
}
