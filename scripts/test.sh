#!/usr/bin/env bash
# Set-up, build and every test: the one command that checks ZEST on a fresh
# machine. Exits non-zero on any failure.
#
#   scripts/test.sh                      # build/ with CUDA when the toolkit is there
#   ZEST_BUILD_DIR=build-x ZEST_CMAKE_ARGS="-DZEST_CUDA=OFF" scripts/test.sh
#   ZEST_BUILD_TARGETS="test_comm test_engine" ZEST_CTEST_ARGS="-R ^test_comm:" scripts/test.sh
#
# The CUDA backend is built where a GPU can run it (nvidia-smi lists one), or
# where ZEST_CMAKE_ARGS asks with -DZEST_CUDA=ON; on a machine without a GPU
# its tests could only be skipped, and .ci/run's offline GPU kit build
# (scripts/offline_build_check.sh) compiles every CUDA target for sm_90.
# Tests that need a GPU report themselves skipped on machines without one
# (scripts/gpu_check.sh runs them where one is).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build}"
jobs="$(nproc)"

cuda_args=()
if [[ " ${ZEST_CMAKE_ARGS:-} " != *" -DZEST_CUDA="* ]] && ! { command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; }; then
  cuda_args=(-DZEST_CUDA=OFF)
fi
start=$SECONDS
"$root/scripts/setup.sh"
setup_s=$((SECONDS - start))
# shellcheck disable=SC2086  # ZEST_CMAKE_ARGS is a list of arguments
cmake -S "$root" -B "$build" -G Ninja -DZEST_WERROR=ON "${cuda_args[@]}" ${ZEST_CMAKE_ARGS:-}
# shellcheck disable=SC2086  # ZEST_BUILD_TARGETS is a list of targets
cmake --build "$build" -j "$jobs" ${ZEST_BUILD_TARGETS:+--target $ZEST_BUILD_TARGETS}
build_s=$((SECONDS - start - setup_s))
ctest --test-dir "$build" --output-on-failure -j "$jobs" ${ZEST_CTEST_ARGS:-}
echo "test.sh: set-up ${setup_s} s, configure and build ${build_s} s, tests $((SECONDS - start - setup_s - build_s)) s"
