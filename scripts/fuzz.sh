#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz) with clang, ASan and UBSan, and
# runs each for a bounded time from its seed corpus. Exits non-zero on a
# finding, leaving the input that caused it in <build>/fuzz-artifacts/.
#
#   scripts/fuzz.sh                                  # 60 s per target, build-fuzz/
#   ZEST_FUZZ_SECONDS=600 scripts/fuzz.sh            # longer
#   ZEST_FUZZ_BUILD_DIR=/tmp/fuzz scripts/fuzz.sh    # elsewhere
#
# Replay a finding: <build>/tests/fuzz/fuzz_<name> <build>/fuzz-artifacts/crash-...
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_FUZZ_BUILD_DIR:-$root/build-fuzz}"
seconds="${ZEST_FUZZ_SECONDS:-60}"

"$root/scripts/setup.sh"
command -v clang++ >/dev/null || { echo "fuzz.sh: needs clang with libFuzzer (apt-get install clang)" >&2; exit 1; }
# Host only, no tests, extras or libtorch layer (libtorch 1.13's headers do
# not compile with clang in C++20): the library and the fuzz targets are all
# this build needs.
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZEST_CUDA=OFF -DZEST_MPI=OFF -DZEST_FUZZ=ON \
  -DZEST_BUILD_TESTS=OFF -DZEST_BUILD_EXTRAS=OFF -DZEST_TORCH=OFF >/dev/null
cmake --build "$build" -j "$(nproc)"

export ASAN_OPTIONS="detect_leaks=1:strict_string_checks=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
artifacts="$build/fuzz-artifacts"
mkdir -p "$artifacts"
status=0
for exe in "$build"/tests/fuzz/fuzz_*; do
  [ -x "$exe" ] || continue
  name="$(basename "$exe")"
  topic="${name#fuzz_}"
  # New inputs go to the build's corpus; the committed seeds stay read-only.
  work="$build/fuzz-corpus/$topic"
  mkdir -p "$work"
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1
        -artifact_prefix="$artifacts/$name-")
  [ -f "$root/tests/fuzz/$topic.dict" ] && args+=(-dict="$root/tests/fuzz/$topic.dict")
  log="$build/$name.log"
  echo "fuzz.sh: $name for ${seconds}s (log: $log)"
  if "$exe" "${args[@]}" "$work" "$root/tests/fuzz/corpus/$topic" >"$log" 2>&1; then
    grep -E '^stat::(number_of_executed_units|new_units_added)' "$log" | sed "s/^/fuzz.sh: $name /"
  else
    echo "fuzz.sh: $name FOUND A PROBLEM; the input is in $artifacts; the end of the log:" >&2
    tail -n 60 "$log" >&2
    status=1
  fi
done
exit "$status"
