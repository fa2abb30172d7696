#!/usr/bin/env bash
# Installs the Debian packages that ZEST's build needs, when they are missing.
# Safe to run again: it does nothing when everything is there. The CUDA
# toolkit is not installed here; the build finds it at /usr/local/cuda and
# builds host-only without it.
set -euo pipefail

packages=(
  cmake ninja-build g++ ccache
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
)

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
