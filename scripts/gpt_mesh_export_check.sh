#!/bin/sh
# The GPT example's --export and --export-hf from a device mesh against one
# rank, through its command line: `gpt_mesh_export_check.sh GPT [MESH
# FLAGS...]` builds the same small model untrained (--steps 0: the initial
# values, the same on any mesh) with the mesh flags (e.g. --ranks 8 --tp 2
# --pp 2) and with --ranks 1, exports it as a safetensors file and as a
# Hugging Face directory in several shards, and compares the files byte for
# byte (checkpoint/whole_model.h). Exit 0 when they agree.
set -eu
gpt=$1
shift
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common="--steps 0 --stage 3 --batch 8 --accum 2 --layers 2 --heads 2 --d-model 32 --context 32 --val-windows 4 \
--sample-bytes 0 --export-dtype fp32 --max-shard-size 40000"
"$gpt" --ranks 1 $common --export "$dir/one.safetensors" --export-hf "$dir/one_hf" > "$dir/one.log"
"$gpt" "$@" $common --export "$dir/mesh.safetensors" --export-hf "$dir/mesh_hf" > "$dir/mesh.log"
grep '^exported' "$dir/mesh.log"
cmp "$dir/one.safetensors" "$dir/mesh.safetensors"
diff -r "$dir/one_hf" "$dir/mesh_hf"
echo "agree: $(ls "$dir/mesh_hf" | wc -l) files of the Hugging Face directory and the safetensors file"
