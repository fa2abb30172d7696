#!/usr/bin/env bash
# Installs the Debian packages that ZEST's build needs, when they are missing.
# Safe to run again: it does nothing when everything is there. The CUDA
# toolkit is not installed here; the build finds it at /usr/local/cuda and
# builds host-only without it.
#
#   scripts/setup.sh          the build's packages
#   scripts/setup.sh --peer   those and Python torch (python3-torch, ~32
#                             packages), which only bench/peer needs (the
#                             GPT example's peer in torch DDP)
set -euo pipefail

peer=0
for arg in "$@"; do
  case "$arg" in
    --peer) peer=1 ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "setup.sh: unknown argument '$arg' (expected --peer or --help)" >&2; exit 2 ;;
  esac
done

packages=(
  cmake ninja-build g++ ccache
  lld             # the linker where it works (cmake/ZestBuildSpeed.cmake): faster links than ld.bfd
  libfmt-dev doctest-dev nlohmann-json3-dev
  libcli11-dev    # command lines of tools/, examples/ and bench/ (header-only)
  libopenmpi-dev openmpi-bin
  libtorch-dev    # the torch/ layer (zest::torch) and its tests (CPU libtorch 1.13)
  libopenblas0-openmp  # libtorch's BLAS: Debian's default, the reference BLAS, trains the GPT example ~14x slower
  fortunes        # the GPT example's text (/usr/share/games/fortunes)
  clang python3   # the fuzz targets (libFuzzer); the safetensors interop check
  iproute2        # ip and tc: the simulated hosts of scripts/sim_hosts.sh (tests/multihost)
  nftables        # their packet loss where the kernel has no netem
  liburing-dev    # the NVMe tier's io_uring back end (nvme/); without it the thread pool serves
  libsentencepiece-dev  # tokenizer/: text JSONL with a checkpoint's tokenizer.model
)
if [ "$peer" -eq 1 ]; then
  packages+=(python3-torch)  # torch 1.13 for Debian's python3 (bench/peer); large, so opt-in
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "setup.sh: need root (or sudo) to install: ${missing[*]}" >&2; exit 1; }
  sudo="sudo"
fi
echo "setup.sh: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
