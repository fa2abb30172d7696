#!/usr/bin/env bash
# On a GPU machine: builds ZEST for Hopper (sm_90) with every core, then runs
# the GPU tests (the Engine over NCCL with one process per GPU among them),
# the torch layer's tests against the image's libtorch, a short run under
# compute-sanitizer, the benchmarks with their targets (cached allocation
# >= 100x cudaMalloc, the fused AdamW update >= 90% of a copy's bandwidth,
# stage 3's step <= 1.3x stage 2's), and the whole host test suite. GPU
# tests fail rather than skip here (ZEST_TEST_DEVICE=cuda), so a run that
# did not reach the GPU cannot pass.
#
#   scripts/gpu_check.sh build    configure and build (under 10 minutes on 16 cores)
#   scripts/gpu_check.sh test     tests, sanitizer and benchmarks (under 10 minutes)
#   scripts/gpu_check.sh          both
#   scripts/gpu_check.sh lease    what fits a lease of 15 minutes in one
#                                 command: the GPU's targets, the GPT, the
#                                 benchmarks; no host suite (ZEST_GPU_CHECK_BUDGET 540)
#
# Made for the offline GPU machines (CUDA 13 and nvcc, CMake, ninja,
# compute-sanitizer, python3 with PyTorch's CUDA wheel and nvidia-nccl; no
# package registry): the headers the image lacks come from gpu-kit/, which
# scripts/gpu_deps.sh gathers on a machine that has Debian's registry (name
# it in the device tool's `carry`); NCCL from the CUDA toolkit or else from
# the nvidia-nccl wheel (the one PyTorch loads, preferred when PyTorch is
# there); libtorch from PyTorch (torch.utils.cmake_prefix_path) with the
# wheel's C++ ABI. Without gpu-kit/ the system's packages are used.
#
# Logs and summary.txt go to $OUT when set (the device tool brings back at
# most 8 files: this script writes summary.txt, configure.log, build.log,
# gpu_tests.log, sanitizer.log, bench.log, host_tests.log and env.log), else
# to build-gpu/gpu-check/. Exit status: 0 when every step passed.
#
# Environment: ZEST_BUILD_DIR (build-gpu), ZEST_GPU_KIT (gpu-kit), PYTHON
# (python3), ZEST_GPU_CHECK_BUDGET (seconds a phase may take, 570).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build-gpu}"
kit="${ZEST_GPU_KIT:-$root/gpu-kit}"
python="${PYTHON:-python3}"
out="${OUT:-$build/gpu-check}"
phase="${1:-all}"
case "$phase" in
  build|test|all|lease) ;;
  *) echo "usage: scripts/gpu_check.sh [build|test|lease]" >&2; exit 2 ;;
esac
mkdir -p "$out" "$build"
cd "$root" || exit 1
# nvcc and compute-sanitizer, where the toolkit is not on the PATH.
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
jobs="$(nproc)"
budget="${ZEST_GPU_CHECK_BUDGET:-$([ "$phase" = lease ] && echo 540 || echo 570)}"
start=$SECONDS
status=0
summary="$out/summary.txt"

note() { echo "$*" | tee -a "$summary"; }
# The seconds left of this phase's budget, less `reserve`.
left() { echo $(( budget - (SECONDS - start) - ${1:-0} )); }
# step NAME LOG LIMIT CMD...: runs CMD under `timeout` (LIMIT seconds, cut to
# what is left of the budget), appending to LOG; notes PASS, FAIL or TIMEOUT.
step() {
  local name="$1" log="$2" limit="$3"
  shift 3
  local l
  l=$(left 10)
  [ "$limit" -gt "$l" ] && limit=$l
  if [ "$limit" -le 0 ]; then
    note "SKIPPED (no time left): $name"
    status=1
    return 1
  fi
  echo "=== $name ($(date -u +%H:%M:%S), limit ${limit}s): $*" >>"$log"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then
    note "PASS     $name ($((SECONDS - t0)) s)"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    note "TIMEOUT  $name (after ${limit} s; see $(basename "$log"))"
    status=1
  else
    note "FAIL     $name (exit $rc; see $(basename "$log"))"
    status=1
  fi
  return $rc
}

# --- build ---------------------------------------------------------------
configure() {
  : >"$out/configure.log"
  : >"$out/build.log"
  note "# gpu_check.sh build, $(date -u +%Y-%m-%dT%H:%M:%SZ), $jobs cores"
  {
    nvidia-smi -L
    nvcc --version | tail -n 2
    cmake --version | head -n 1
    "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  } >>"$out/env.log" 2>&1

  local args=(-G Ninja -DCMAKE_BUILD_TYPE=Release -DZEST_CUDA=ON -DZEST_MPI=OFF
              -DCMAKE_CUDA_ARCHITECTURES=90 -DZEST_FMT_HEADER_ONLY=ON
              "-DPython3_EXECUTABLE=$(command -v "$python" || echo "$python")")
  local prefixes=()
  if [ -f "$kit/usr/include/fmt/format.h" ]; then
    prefixes+=("$kit/usr")
  else
    note "note: no $kit (run scripts/gpu_deps.sh where Debian's registry is reachable); using the system's packages"
  fi

  # libtorch from PyTorch, with its C++ ABI for the whole build.
  local torch_prefix abi
  torch_prefix=$("$python" -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>>"$out/env.log")
  abi=$("$python" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))' 2>>"$out/env.log")
  local torch=OFF
  if [ -n "$torch_prefix" ] && [ -n "$abi" ]; then
    prefixes+=("$torch_prefix")
    args+=("-DCMAKE_CXX_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$abi" "-DCMAKE_CUDA_FLAGS=-D_GLIBCXX_USE_CXX11_ABI=$abi")
    # Torch's CMake package asks the GPU for the architectures unless told
    # (its NVTX3: cmake/ZestTorchNvtx.cmake).
    export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
    torch=ON
    note "libtorch: $torch_prefix (_GLIBCXX_USE_CXX11_ABI=$abi)"
  else
    note "FAIL     no PyTorch in $python: the libtorch layer is not built (see env.log)"
    status=1
  fi
  # NCCL: with PyTorch, the wheel's (libtorch_cuda loads that one into the
  # process, and two NCCLs must not meet there); else the CUDA toolkit's, the
  # system's or the wheel's, whichever CMake finds first (cmake/ZestFindNccl.cmake).
  [ "$torch" = ON ] && args+=(-DZEST_NCCL_ROOT=wheel)

  local prefix_list
  prefix_list=$(IFS=';'; echo "${prefixes[*]}")
  # Warnings are logged, not errors: a newer compiler's new warning must not
  # cost the one visit a GPU machine allows.
  if ! step "configure (libtorch $torch)" "$out/configure.log" 240 \
      cmake -S "$root" -B "$build" "${args[@]}" "-DCMAKE_PREFIX_PATH=$prefix_list" -DZEST_TORCH=$torch; then
    if [ "$torch" = ON ]; then
      # Without the torch layer the rest of the check still runs; the
      # failure above stays in the status.
      # ... with NCCL from wherever CMake finds it (the wheel was asked for
      # only to share libtorch's).
      local plain=()
      for a in "${args[@]}"; do [ "$a" = -DZEST_NCCL_ROOT=wheel ] || plain+=("$a"); done
      step "configure without libtorch" "$out/configure.log" 240 \
        cmake -S "$root" -B "$build" "${plain[@]}" -DZEST_NCCL_ROOT= "-DCMAKE_PREFIX_PATH=$prefix_list" -DZEST_TORCH=OFF || return
    else
      return
    fi
  fi
  grep -E '^-- ZEST:' "$out/configure.log" | tee -a "$summary"  # backends, NCCL, libtorch
}

# build NAME LIMIT [TARGET...]: builds the targets (everything when none is
# named), going on past a failed one (-k 0) so that the rest still run.
build() {
  local name="$1" limit="$2"
  shift 2
  local targets=()
  [ $# -gt 0 ] && targets=(--target "$@")
  step "build $name ($jobs jobs)" "$out/build.log" "$limit" \
    cmake --build "$build" -j "$jobs" "${targets[@]}" -- -k 0
}

warnings() {
  grep -E 'warning:' "$out/build.log" | sort | uniq -c | sort -rn | head -n 20 >>"$summary"
}

configure_and_build() {
  configure || return
  # ninja resumes an interrupted build: run this phase again if it timed out.
  build everything 600 || true
  warnings
}

# --- test ----------------------------------------------------------------
# ratio_check NAME VALUE OP TARGET: notes whether VALUE meets the target.
ratio_check() {
  local name="$1" value="$2" op="$3" target="$4"
  if [ -z "$value" ]; then
    note "FAIL     $name: no figure in bench.log"
    status=1
  elif awk -v v="$value" -v t="$target" -v op="$op" 'BEGIN { exit !((op == ">=") ? v >= t : v <= t) }'; then
    note "PASS     $name: $value (target $op $target)"
  else
    note "MISSED   $name: $value (target $op $target)"
    status=1
  fi
}

# The GPU's environment for every run below.
test_env() {
  export ZEST_TEST_DEVICE=cuda ZEST_REQUIRE_GPU=1
  # The install consumers' find_package(Torch), as in the build phase.
  export TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-9.0}"
  # NCCL's bootstrap on the loopback: these machines have no other network.
  export NCCL_SOCKET_IFNAME="${NCCL_SOCKET_IFNAME:-lo}"
  nvidia-smi >>"$out/env.log" 2>&1 || { note "FAIL     nvidia-smi found no GPU"; status=1; }
}

# The GPU tests, two at a time on the one GPU (the Engine over NCCL among
# them, one process per GPU), and the example MLP on the GPU.
gpu_tests() {
  step "GPU tests (ctest -L gpu)" "$out/gpu_tests.log" 200 \
    ctest --test-dir "$build" -L gpu --output-on-failure -j 2
  # Under every stage (cuBLAS forward and backward, 4 in-process ranks
  # sharing the GPU) ...
  step "mlp example, cuda, stages 0-3" "$out/gpu_tests.log" 90 \
    "$build/examples/mlp/mlp" --device cuda --ranks 4 --stages 0,1,2,3 --dtype bf16 --steps 50 --print-every 25
  # ... and as a launched job over NCCL (one process: rank 0 of 1).
  step "mlp example, --launch over NCCL, stage 3" "$out/gpu_tests.log" 60 \
    "$build/examples/mlp/mlp" --launch --device cuda --stage 3 --dtype bf16 --steps 50 --print-every 25
}

# The GPT example through zest::TorchModule on the GPU, with the image's
# libtorch: one rank (the default on a GPU) at stages 0-3, on deterministic
# kernels (the example asks for them on CUDA; cuBLAS needs the workspace
# setting), so the final validation loss must be the same bits at every
# stage; and 2 in-process ranks on the one GPU refused by name (libtorch's
# one autograd thread for the GPU would deadlock them:
# backward_thread_conflict in torch_module.h). Its output goes to
# gpu_tests.log (no more files come back from $OUT).
gpt_cuda() {
  [ -x "$build/examples/gpt/gpt" ] || { note "FAIL     gpt example, cuda: not built (see build.log)"; status=1; return; }
  # The corpus from the kit where the image has no fortunes.
  local data=/usr/share/games/fortunes
  [ -d "$data" ] || data="$kit/usr/share/games/fortunes"
  local gpt_log
  gpt_log=$(mktemp)
  if step "gpt example, cuda, stages 0-3" "$gpt_log" 120 env CUBLAS_WORKSPACE_CONFIG=:4096:8 \
      "$build/examples/gpt/gpt" --data "$data" --device cuda --stages 0,1,2,3 --steps 30 --print-every 10 \
      --eval-every 1000 --val-windows 32 --sample-bytes 0; then
    local losses
    losses=$(grep '^final validation loss, stage' "$gpt_log" | awk '{print $NF}' | sort -u | wc -l)
    if [ "$losses" = 1 ]; then
      note "PASS     gpt example, cuda: the same validation loss, bit for bit, at stages 0-3"
    else
      note "FAIL     gpt example, cuda: the stages' validation losses differ (see gpu_tests.log)"
      status=1
    fi
  fi
  cat "$gpt_log" >>"$out/gpu_tests.log"
  : >"$gpt_log"
  local rc
  timeout --kill-after=10 60 "$build/examples/gpt/gpt" --data "$data" --device cuda --ranks 2 --steps 2 \
    --sample-bytes 0 >"$gpt_log" 2>&1
  rc=$?
  if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ] && grep -q 'in-process ranks share cuda:0' "$gpt_log"; then
    note "PASS     gpt example, cuda: 2 in-process ranks on one GPU refused by name"
  else
    note "FAIL     gpt example, cuda: 2 in-process ranks on one GPU not refused (see gpu_tests.log)"
    status=1
  fi
  cat "$gpt_log" >>"$out/gpu_tests.log"
  rm -f "$gpt_log"
}

# A short run under compute-sanitizer: the optimizer, gradient and norm
# kernels (memcheck, racecheck for the shared-memory reductions).
sanitizer() {
  local optim="$build/tests/cuda/gpu_test_optim"
  step "compute-sanitizer memcheck (gpu_test_optim)" "$out/sanitizer.log" 60 \
    compute-sanitizer --tool memcheck --error-exitcode 99 "$optim" \
    --test-case='*bf16 gradients*,*chunk sums*,*step decisions*'
  step "compute-sanitizer racecheck (gpu_test_optim)" "$out/sanitizer.log" 60 \
    compute-sanitizer --tool racecheck --error-exitcode 99 "$optim" --test-case='*chunk sums of squares*'
}

# The benchmarks and their targets, on a quiet machine.
benches() {
  local bench="$out/bench.log"
  step "allocator_bench cuda" "$bench" 40 "$build/bench/allocator_bench" --device cuda:0 --quick
  # Each size's raw/cached median ratio (the last column); the smallest counts.
  ratio_check "cached allocation vs cudaMalloc (smallest ratio over sizes)" \
    "$(awk '/^=== / {on = /^=== allocator_bench/} on && /^ +[0-9.]+ ?[KMG]?i?B / {print $NF}' "$bench" | sort -g | head -n 1)" ">=" 100
  step "optimizer_bench cuda" "$bench" 40 "$build/bench/optimizer_bench" --device cuda:0 --numel 268435456 --iters 20
  # "the update takes X x the copy's time": 90% of copy bandwidth is X <= 1/0.9.
  ratio_check "fused AdamW vs a copy of its bytes (time ratio)" \
    "$(sed -n 's/^ratio: the update takes \([0-9.]*\)x.*/\1/p' "$bench" | tail -n 1)" "<=" 1.111
  # One engine step at stages 0-3 on the GPU (2 in-process ranks sharing it).
  step "step_bench cuda, stages 0-3" "$bench" 60 \
    "$build/bench/step_bench" --device cuda:0 --params 50000000 --ranks 2 --steps 5 --dtype bf16
  # ... and at a size where the step is the GPU's work, not launches.
  step "step_bench cuda, stages 0-3, 400M" "$bench" 90 \
    "$build/bench/step_bench" --device cuda:0 --params 400000000 --ranks 2 --steps 5 --dtype bf16
  ratio_check "step time, stage 3 / stage 2" \
    "$(sed -n 's/^stage 3 \/ stage 2 step: \([0-9.]*\).*/\1/p' "$bench" | tail -n 1)" "<=" 1.3
  # Collectives, --quick (1 KiB to 4 MiB): NCCL as one process (rank 0 of
  # 1), and the in-process backend with 2 ranks sharing the GPU.
  step "comm_bench nccl, 1 rank" "$bench" 45 "$build/bench/comm_bench" --backend nccl --quick
  step "comm_bench inprocess, cuda, 2 ranks" "$bench" 45 \
    "$build/bench/comm_bench" --backend inprocess --ranks 2 --device cuda:0 --quick
}

run_tests() {
  note "# gpu_check.sh test, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  [ -f "$build/CTestTestfile.cmake" ] || { note "FAIL     nothing built in $build: run scripts/gpu_check.sh build first"; status=1; return; }
  test_env
  # The whole host suite (the torch layer's tests against the image's
  # libtorch among them; the AVX-512 variants on this CPU) in the
  # background on all but 4 cores, while the GPU tests run; the benchmarks
  # after both, on a quiet machine.
  local host_limit
  host_limit=$(left 240)
  step "host tests (ctest -LE gpu)" "$out/host_tests.log" "$host_limit" \
    nice -n 5 ctest --test-dir "$build" -LE gpu --output-on-failure -j "$(( jobs > 8 ? jobs - 4 : jobs ))" &
  local host_pid=$!
  gpu_tests
  gpt_cuda
  sanitizer
  wait "$host_pid" || status=1
  tail -n 3 "$out/host_tests.log" >>"$summary"
  benches
}

# What a lease of 15 minutes allows, in one command of 10: the GPU's
# targets alone (the host suite is CI's), the torch layer built in the
# background while the GPU tests run, then the GPT on the GPU and the
# benchmarks on a quiet machine.
gpu_targets=(gpu_test_float16 gpu_test_allocator gpu_test_checks gpu_test_comm gpu_test_device
             gpu_test_engine gpu_test_optim gpu_test_engine_nccl gpu_test_mlp
             mlp allocator_bench optimizer_bench step_bench comm_bench)
lease() {
  configure || return
  build "of the GPU's targets" 300 "${gpu_targets[@]}"
  note "# gpu_check.sh lease tests, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  test_env
  (build "of the GPT and the torch layer's tests (libtorch)" "$(left 200)" gpt test_torch test_gpt_example \
     test_llama_example) &
  local torch_pid=$!
  gpu_tests
  sanitizer
  wait "$torch_pid" || status=1
  warnings
  gpt_cuda
  benches
  # The torch layer's and the examples' models' tests against the image's
  # libtorch (2.x), with what time is left.
  step "torch layer's and models' tests (ctest -R ^test_(torch|gpt_example|llama_example):)" \
    "$out/host_tests.log" 300 \
    ctest --test-dir "$build" -R '^test_(torch|gpt_example|llama_example):' --output-on-failure -j "$jobs"
}

case "$phase" in
  build) configure_and_build ;;
  test) run_tests ;;
  all) configure_and_build; start=$SECONDS; run_tests ;;
  lease) lease ;;
esac
# The device tool brings back files of at most 16 MiB.
for f in "$out"/*.log; do
  [ -f "$f" ] && [ "$(stat -c %s "$f")" -gt 15000000 ] && { tail -c 15000000 "$f" >"$f.tmp"; mv "$f.tmp" "$f"; }
done
note "# $phase: $([ $status -eq 0 ] && echo PASSED || echo FAILED) in $((SECONDS - start)) s"
exit $status
