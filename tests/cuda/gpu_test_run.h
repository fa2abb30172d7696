// The body of the GPU test executables' main. Where no GPU is visible they
// exit 77, which ctest reports as skipped (SKIP_RETURN_CODE), unless the run
// says a GPU must be there: ZEST_TEST_DEVICE=cuda (or cuda:N), which
// scripts/gpu_check.sh exports, or ZEST_REQUIRE_GPU=1. Then a machine whose
// GPU or driver went missing fails instead of passing by skipping.
// Include from the one file of an executable that defines
// DOCTEST_CONFIG_IMPLEMENT (it registers ran_tests.h's listener).
#pragma once

#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "zest/core/check.h"
#include "zest/core/device.h"
#include "ran_tests.h"

namespace zest_test {

// Why this run must have a GPU, or an empty string when it may skip; sets
// `bad` to a description of a ZEST_TEST_DEVICE it does not understand.
inline std::string gpu_required_by(std::string& bad) {
  const char* device = std::getenv("ZEST_TEST_DEVICE");
  if (device != nullptr && device[0] != '\0') {
    const std::string d = device;
    if (d == "cuda" || d.rfind("cuda:", 0) == 0) return "ZEST_TEST_DEVICE=" + d;
    if (d != "host" && d != "cpu") {
      bad = "ZEST_TEST_DEVICE=" + d + " is not a device the tests know: use cuda (a GPU must be there) or host";
    }
  }
  const char* require = std::getenv("ZEST_REQUIRE_GPU");
  if (require != nullptr && std::strcmp(require, "1") == 0) return "ZEST_REQUIRE_GPU=1";
  return {};
}

inline int run_gpu_tests(int argc, char** argv) {
  std::string bad;
  const std::string required_by = gpu_required_by(bad);
  if (!bad.empty()) {
    std::fprintf(stderr, "%s\n", bad.c_str());
    return 1;
  }
  int devices = 0;
  std::string why = "no CUDA device visible";
  try {
    devices = zest::cuda_device_count();
  } catch (const zest::Error& e) {
    // A driver that answers with an unexpected error has no usable GPU either.
    why = std::string("the CUDA device query failed: ") + e.what();
  }
  if (devices == 0) {
    if (!required_by.empty()) {
      std::fprintf(stderr, "FAILED: %s, but %s says this run must reach a GPU\n", why.c_str(),
                   required_by.c_str());
      return 1;
    }
    std::printf("SKIPPED: %s\n", why.c_str());
    return 77;
  }
  doctest::Context context(argc, argv);
  const int rc = context.run();
  if (context.shouldExit()) return rc;
  return fail_if_none_ran(rc);
}

}  // namespace zest_test
