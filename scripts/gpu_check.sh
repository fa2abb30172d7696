#!/usr/bin/env bash
# On a GPU machine: build for Hopper (sm_90) and run every test with the CUDA
# backend, then the GPU benchmarks (allocator, collectives over NCCL and the
# in-process backend, the optimizer kernel) and the example on the GPU. GPU tests fail rather than skip here
# (ZEST_REQUIRE_GPU=1), so a run that did not reach the GPU cannot pass.
# Logs go to $OUT when set (the device tool's output folder), else build-gpu/.
#
# Where no package registry is reachable, run scripts/gpu_deps.sh beforehand
# on a machine that has one; the .deb files it leaves in .deps/debs are
# unpacked into .deps/root here.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build-gpu}"
out="${OUT:-$build}"
mkdir -p "$out"
cd "$root"

nvidia-smi -L || { echo "gpu_check.sh: nvidia-smi found no GPU" >&2; exit 1; }

prefix_args=()
if [ -d .deps/debs ] && ls .deps/debs/*.deb >/dev/null 2>&1; then
  mkdir -p .deps/root
  for f in .deps/debs/*.deb; do dpkg -x "$f" .deps/root; done
  prefix_args=(-DCMAKE_PREFIX_PATH="$root/.deps/root/usr")
  export LD_LIBRARY_PATH="$root/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}"
elif command -v apt-get >/dev/null; then
  scripts/setup.sh
fi

cmake -S . -B "$build" -G Ninja -DZEST_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_BUILD_TYPE=Release "${prefix_args[@]}" 2>&1 | tee "$out/configure.log"
cmake --build "$build" -j "$(nproc)" 2>&1 | tail -n 50 | tee "$out/build.log"

status=0
ZEST_REQUIRE_GPU=1 ZEST_TEST_DEVICE=cuda \
  ctest --test-dir "$build" --output-on-failure -j 4 2>&1 | tee "$out/ctest.log" || status=1

"$build/bench/allocator_bench" --device cuda:0 2>&1 | tee "$out/allocator_bench_cuda.log" || status=1
"$build/bench/allocator_bench" --device host 2>&1 | tee "$out/allocator_bench_host.log" || status=1

# Collectives, --quick (1 KiB to 4 MiB, fewer calls per size): NCCL as one
# process without a launcher (rank 0 of 1, on cuda:0, its bootstrap socket on
# the loopback), and the in-process backend with 2 ranks sharing the GPU.
# Each takes a minute or two; `timeout` ends a hang instead of letting it hold
# the machine.
NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}" timeout 300 \
  "$build/bench/comm_bench" --backend nccl --quick 2>&1 | tee "$out/comm_bench_nccl_1rank.log" || status=1
timeout 300 "$build/bench/comm_bench" --backend inprocess --ranks 2 --device cuda:0 --quick 2>&1 \
  | tee "$out/comm_bench_inprocess_cuda_2ranks.log" || status=1

# The fused AdamW update against a copy of the same bytes (28 per parameter;
# the H100's 3.35 TB/s makes about 1.2e11 parameters/s), and the example MLP
# on the GPU under every stage (cuBLAS forward/backward, 4 in-process ranks).
"$build/bench/optimizer_bench" --device cuda:0 --numel 268435456 --iters 20 2>&1 \
  | tee "$out/optimizer_bench_cuda.log" || status=1
timeout 300 "$build/examples/mlp/mlp" --device cuda --ranks 4 --stages 0,1,2,3 --dtype bf16 --steps 100 \
  --print-every 25 2>&1 | tee "$out/mlp_cuda.log" || status=1
exit $status
