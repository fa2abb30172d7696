#!/usr/bin/env bash
# Set-up, build, and the main job on an embedded default. Until the ZeRO
# engine lands this is the memory layer's tour: a training loop's allocations
# by category through the caching allocator, then the allocator benchmark
# (cached path against the raw allocator) on the host.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build}"

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja ${ZEST_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)" --target zest-info allocator_tour allocator_bench

"$build/tools/zest-info"
echo
"$build/examples/allocator_tour" host 25000000
echo
"$build/bench/allocator_bench" --device host --quick
