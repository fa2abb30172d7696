#!/usr/bin/env bash
# Set-up, build, and the main job on an embedded default: the MLP example
# trained by 4 in-process ranks under ZeRO stages 0, 1, 2 and 3 on the host
# (bf16 parameters and gradients, fp32 master weights, AdamW), then a table of
# final loss and per-rank memory by category against the ZeRO formula; then
# the measured memory of stages 0-3 on 1, 2, 4 and 8 ranks against the memory
# estimator, as tables, Markdown and an SVG chart in the build directory.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build}"

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja ${ZEST_CMAKE_ARGS:-} >/dev/null
cmake --build "$build" -j "$(nproc)" --target zest-info mlp memory_compare

"$build/tools/zest-info"
echo
"$build/examples/mlp/mlp" --ranks 4 --stages 0,1,2,3 --dtype bf16 --steps 100 --print-every 25
echo
"$build/examples/memory_compare/memory_compare" --markdown "$build/memory_compare.md" --svg "$build/memory_compare.svg"
