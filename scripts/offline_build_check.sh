#!/usr/bin/env bash
# Proves that the offline GPU kit is enough: configures ZEST with the CUDA
# backend on and MPI and libtorch off, with only gpu-kit/ (scripts/gpu_deps.sh)
# and the CUDA toolkit for its dependencies, the system's -dev packages
# hidden from CMake, builds the library, the core tests (doctest), a CUDA
# test, the Engine-over-NCCL test and the tools (CLI11), and runs the host
# tests, the CMake checks and the install consumer against them.
#
# Hidden from CMake is not hidden from the compiler: /usr/include, where
# this machine's fmt, doctest, nlohmann-json and CLI11 headers are, stays on
# its default search path, so a target that forgot to link a kit target
# would still build here and fail on the GPU machine. The check that
# matters is therefore on what was really read: every header dependency the
# compilers reported (ninja -t deps), which must not name those folders, and
# every package CMake loaded, which must come from the kit.
#
# fmt is header-only here as on the GPU machine, which triples the compile
# time of a ZEST source. What is checked is what the compilers read and
# what the programs link, not how fast they run, so the build is Debug
# (-O0). At RelWithDebInfo it took 19 CPU-minutes, 9.5 minutes on 2 idle
# cores with a cold ccache.
#
#   scripts/offline_build_check.sh
#   ZEST_BUILD_DIR=build-x scripts/offline_build_check.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build-offline}"
kit="${ZEST_GPU_KIT:-$root/gpu-kit}"
fail() { echo "offline_build_check.sh: $*" >&2; exit 1; }

[ -x /usr/local/cuda/bin/nvcc ] || fail "needs the CUDA toolkit at /usr/local/cuda (nvcc), as the GPU image has"
ZEST_GPU_KIT="$kit" "$root/scripts/gpu_deps.sh"

# Every prefix the system's -dev packages live under, and their package
# folders by name for CMake before 3.23 (no CMAKE_IGNORE_PREFIX_PATH).
hidden_prefixes="/usr;/usr/local;/"
hidden_dirs="/usr/include;/usr/lib/x86_64-linux-gnu/cmake;/usr/lib/cmake;/usr/share/cmake"
for d in fmt doctest nlohmann_json CLI11 Torch Caffe2 MPI; do
  for base in /usr/lib/x86_64-linux-gnu/cmake /usr/lib/cmake /usr/share/cmake /usr/local/lib/cmake; do
    hidden_dirs="$hidden_dirs;$base/$d"
  done
done

rm -rf "$build"
cmake -S "$root" -B "$build" -G Ninja -DZEST_WERROR=ON -DCMAKE_BUILD_TYPE=Debug \
  -DZEST_CUDA=ON -DZEST_MPI=OFF -DZEST_TORCH=OFF -DZEST_FMT_HEADER_ONLY=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_PREFIX_PATH="$kit/usr" \
  -DCMAKE_IGNORE_PREFIX_PATH="$hidden_prefixes" -DCMAKE_IGNORE_PATH="$hidden_dirs" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF

# Each package CMake loaded, from the kit.
for pkg in fmt doctest nlohmann_json CLI11; do
  dir=$(sed -n "s/^${pkg}_DIR:PATH=//p" "$build/CMakeCache.txt")
  case "$dir" in
    "$kit"/*) echo "offline_build_check.sh: $pkg from $dir" ;;
    *) fail "$pkg was found at '$dir', not in $kit" ;;
  esac
done

# The tools too, since the install (install_consumer) copies them.
# Every target with CUDA code (scripts/test.sh builds the CUDA backend only
# where a GPU is visible, so this is where CI compiles it): the library, the
# GPU tests, the example and benchmarks with device paths, the tools and
# the documentation's CUDA examples.
targets=(zest test_core gpu_test_float16 gpu_test_allocator gpu_test_checks gpu_test_comm gpu_test_device
         gpu_test_engine gpu_test_optim gpu_test_engine_nccl gpu_test_mlp mlp allocator_bench comm_bench
         zest-info zest-estimate zest-ckpt doc_examples)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"

# What the compilers read: no header of the hidden packages from the system.
deps="$build/offline_deps.txt"
ninja -C "$build" -t deps >"$deps"
grep -q 'gpu-kit/usr/include/fmt/' "$deps" || fail "no kit fmt header in the dependencies: is ninja -t deps empty?"
if grep -E '^ +/usr/include/(fmt|doctest|nlohmann|CLI)/' "$deps" | sort -u | head -n 5 | grep .; then
  fail "the build read the system's headers above instead of the kit's ($deps)"
fi
# Header-only fmt: no program needs a libfmt where it runs.
for t in test_core gpu_test_float16 zest-estimate; do
  exe=$(find "$build" -name "$t" -type f -perm -u+x | head -n 1)
  [ -n "$exe" ] || fail "$t was not built"
  if readelf -d "$exe" | grep -q 'libfmt'; then fail "$exe needs libfmt at run time"; fi
done

ctest --test-dir "$build" --output-on-failure -j "$(nproc)" \
  -R '^test_core:|^gpu_test_device_(required|unknown)$|^cmake_nccl_discovery$|^cmake_torch_nvtx$|^install_consumer$'
echo "offline_build_check.sh: the kit builds ZEST with CUDA and NCCL, no system package read"
