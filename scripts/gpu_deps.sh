#!/usr/bin/env bash
# Downloads the Debian packages of ZEST's build dependencies into .deps/debs,
# for a GPU machine that cannot reach a package registry itself: the folder
# travels with the working tree and scripts/gpu_check.sh unpacks it there.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$root/.deps/debs"
cd "$root/.deps/debs"
apt-get update -qq
apt-get download libfmt-dev libfmt9 doctest-dev nlohmann-json3-dev
ls -l
