#!/bin/sh
# An example model on a device mesh against one rank, through its command
# line: `mesh_check.sh BINARY [MESH FLAGS...]`, BINARY the gpt or the llama
# example, trains the same small model for 6 steps of 2 micro-batches at
# ZeRO stages 0 and 3 with the mesh flags (e.g. --ranks 8 --tp 2 --pp 2) and
# with --ranks 1, and compares the final validation losses: within 1e-5
# relative (tests/torch/test_gpt_mesh.cpp says why), the stages' bit for
# bit. Exit 0 when they agree.
# MESH_LAUNCH, when set, runs the mesh under that launcher
# (MESH_LAUNCH="mpiexec -np 4" with --launch among the flags).
set -eu
bin=$1
shift
case $(basename "$bin") in
  gpt) model="--layers 2 --heads 2 --d-model 32 --sample-bytes 0" ;;
  llama) model="" ;;
  *) echo "mesh_check.sh: $bin is neither the gpt nor the llama example" >&2; exit 2 ;;
esac
common="--steps 6 --accum 2 --batch 8 --context 32 --val-windows 16 --eval-every 100 --print-every 100 $model"
final() { sed -n 's/^final validation loss, stage [0-3]: //p'; }
one=$("$bin" --ranks 1 --stage 0 $common | final)
mesh="$(${MESH_LAUNCH:-} "$bin" "$@" --stage 0 $common | final) $(${MESH_LAUNCH:-} "$bin" "$@" --stage 3 $common | final)"
echo "one rank: $one"
echo "mesh ($*), stages 0 and 3: $mesh"
echo "$mesh" | tr ' ' '\n' | awk -v one="$one" '
  NF { n++; d = ($1 - one) / one; if (d < 0) d = -d; if (d > 1e-5) bad = 1; if (n > 1 && $1 != first) bad = 1; if (n == 1) first = $1 }
  END { if (n != 2 || one == "" || bad) { print "MISMATCH"; exit 1 } print "agree" }'
