#!/bin/sh
# The Llama example's --hf and --export-hf on a device mesh, through its
# command line: `llama_mesh_hf_check.sh LLAMA [MESH FLAGS...]` trains the
# small model 2 steps on one rank and exports it as a Hugging Face directory
# in several fp32 shards, loads that directory with the mesh flags (e.g.
# --ranks 8 --tp 2 --pp 2: each rank reads its stage's tensors as its tp
# slices) and exports it again without training (--steps 0), and compares
# the two directories byte for byte. Exit 0 when they agree. With
# LLAMA_CHECK_CONFIG=config.json, the first run builds that model (another
# family: qwen2's biases split with their rows, qwen3's q_norm and k_norm
# whole on every tp rank).
set -eu
llama=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--val-windows 16 --export-dtype fp32 --max-shard-size 300000"
"$llama" --ranks 1 --steps 2 $common ${LLAMA_CHECK_CONFIG:+--config "$LLAMA_CHECK_CONFIG"} --export-hf "$dir/one" \
  > "$dir/one.log"
"$llama" "$@" --hf "$dir/one" --steps 0 $common --export-hf "$dir/mesh" > "$dir/mesh.log"
grep '^exported' "$dir/mesh.log"
diff -r "$dir/one" "$dir/mesh"
echo "agree: $(ls "$dir/mesh" | wc -l) files of the Hugging Face directory"
