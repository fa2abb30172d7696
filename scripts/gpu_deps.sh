#!/usr/bin/env bash
# Gathers what the offline GPU machine's image lacks for ZEST's build into
# gpu-kit/ (ignored by git; name it in the device tool's `carry` so that it
# travels with the working tree): fmt, doctest, nlohmann-json and CLI11, as
# Debian's packages unpacked under gpu-kit/usr. Run it on a machine that
# reaches Debian's registry; scripts/gpu_check.sh then builds with only this
# folder, the CUDA toolkit and the image's PyTorch (NCCL from its wheel).
#
# All four are used as headers: fmt in its header-only form
# (-DZEST_FMT_HEADER_ONLY=ON), so no library built against this machine's
# glibc and libstdc++ has to load on the GPU machine's. libfmt9 is unpacked
# only because fmt's CMake package names its shared library and refuses to
# load when that file is missing. fortunes is the examples' corpus (the GPT
# on the GPU reads gpu-kit/usr/share/games/fortunes).
#
# Safe to run again: packages already downloaded are kept, the folder is
# unpacked afresh. Prints the folder's size (the tool carries 64 MiB in all).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kit="${ZEST_GPU_KIT:-$root/gpu-kit}"
packages=(libfmt-dev libfmt9 doctest-dev nlohmann-json3-dev libcli11-dev fortunes)

mkdir -p "$kit/debs"
cd "$kit/debs"
missing=()
for p in "${packages[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  # A fresh machine may have no package lists yet; refreshing them needs root.
  if ! apt-get download "${missing[@]}"; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    apt-get download "${missing[@]}"
  fi
fi
for p in "${packages[@]}"; do
  n=$(compgen -G "${p}_*.deb" | wc -l)
  [ "$n" -eq 1 ] || { echo "gpu_deps.sh: expected one ${p}_*.deb in $kit/debs, found $n: delete the folder and run again" >&2; exit 1; }
done

rm -rf "${kit:?}/usr"
for f in "$kit"/debs/*.deb; do dpkg-deb -x "$f" "$kit"; done
rm -rf "$kit/usr/share/doc" "$kit/usr/share/lintian"
for h in fmt/format.h doctest/doctest.h nlohmann/json.hpp CLI/CLI.hpp; do
  [ -f "$kit/usr/include/$h" ] || { echo "gpu_deps.sh: $h is missing from $kit/usr/include" >&2; exit 1; }
done
bytes=$(du -sb "$kit" | cut -f1)
# The device tool carries at most 64 MiB of ignored paths in all: a kit that
# grew past 16 MiB took in something it should not have.
[ "$bytes" -lt $((16 * 1024 * 1024)) ] || { echo "gpu_deps.sh: $kit holds $bytes bytes, more than the 16 MiB it should" >&2; exit 1; }
echo "gpu_deps.sh: $kit holds $(du -sh "$kit" | cut -f1) ($bytes bytes): ${packages[*]}"
