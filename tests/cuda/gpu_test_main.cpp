// The doctest main of the GPU test executables (gpu_test_run.h: skipped
// where no GPU is visible, failing there when the run asks for a GPU).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "cuda/gpu_test_run.h"

int main(int argc, char** argv) { return zest_test::run_gpu_tests(argc, argv); }
