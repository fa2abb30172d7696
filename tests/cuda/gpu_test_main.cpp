// The doctest main of the GPU test executables. Where no GPU is visible they
// exit 77, which ctest reports as skipped (SKIP_RETURN_CODE), unless
// ZEST_REQUIRE_GPU=1 says a GPU must be there: then a machine whose GPU or
// driver went missing fails instead of passing by skipping.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zest/core/check.h"
#include "zest/core/device.h"
#include "../ran_tests.h"

int main(int argc, char** argv) {
  int devices = 0;
  std::string why = "no CUDA device visible";
  try {
    devices = zest::cuda_device_count();
  } catch (const zest::Error& e) {
    // A driver that answers with an unexpected error has no usable GPU either.
    why = std::string("the CUDA device query failed: ") + e.what();
  }
  if (devices == 0) {
    const char* require = std::getenv("ZEST_REQUIRE_GPU");
    if (require != nullptr && std::strcmp(require, "1") == 0) {
      std::fprintf(stderr, "%s but ZEST_REQUIRE_GPU=1\n", why.c_str());
      return 1;
    }
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  return zest_test::fail_if_none_ran(rc);
}
