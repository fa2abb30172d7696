#!/usr/bin/env bash
# Set-up, build and every test: the one command that checks ZEST on a fresh
# machine. Exits non-zero on any failure.
#
#   scripts/test.sh                      # build/ with CUDA when the toolkit is there
#   ZEST_BUILD_DIR=build-x ZEST_CMAKE_ARGS="-DZEST_CUDA=OFF" scripts/test.sh
#   ZEST_BUILD_TARGETS="test_comm test_engine" ZEST_CTEST_ARGS="-R ^test_comm:" scripts/test.sh
#
# Tests that need a GPU report themselves skipped on machines without one
# (scripts/gpu_check.sh runs them where one is).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build}"
jobs="$(nproc)"

"$root/scripts/setup.sh"
# shellcheck disable=SC2086  # ZEST_CMAKE_ARGS is a list of arguments
cmake -S "$root" -B "$build" -G Ninja -DZEST_WERROR=ON ${ZEST_CMAKE_ARGS:-}
# shellcheck disable=SC2086  # ZEST_BUILD_TARGETS is a list of targets
cmake --build "$build" -j "$jobs" ${ZEST_BUILD_TARGETS:+--target $ZEST_BUILD_TARGETS}
ctest --test-dir "$build" --output-on-failure -j "$jobs" ${ZEST_CTEST_ARGS:-}
