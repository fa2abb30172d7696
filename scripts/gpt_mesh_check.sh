#!/bin/sh
# The GPT example on a device mesh against one rank, through its command
# line: `gpt_mesh_check.sh GPT [MESH FLAGS...]` trains the same small model
# for 6 steps of 2 micro-batches at ZeRO stages 0 and 3 with the mesh flags
# (e.g. --ranks 8 --tp 2 --pp 2) and with --ranks 1, and compares the final
# validation losses: within 1e-5 relative (tests/torch/test_gpt_mesh.cpp
# says why), the stages' bit for bit. Exit 0 when they agree.
# GPT_MESH_LAUNCH, when set, runs the mesh under that launcher
# (GPT_MESH_LAUNCH="mpiexec -np 4" with --launch among the flags).
set -eu
gpt=$1
shift
common="--steps 6 --accum 2 --batch 8 --layers 2 --heads 2 --d-model 32 --context 32 --val-windows 16 \
--eval-every 100 --print-every 100 --sample-bytes 0"
one=$("$gpt" --ranks 1 --stages 0 $common | sed -n 's/^final validation loss, stage 0: //p')
mesh=$(${GPT_MESH_LAUNCH:-} "$gpt" "$@" --stages 0,3 $common | sed -n 's/^final validation loss, stage [03]: //p')
echo "one rank: $one"
echo "mesh ($*): $(echo $mesh)"
echo "$mesh" | awk -v one="$one" '
  { d = ($1 - one) / one; if (d < 0) d = -d; if (d > 1e-5) bad = 1; if (NR > 1 && $1 != first) bad = 1; if (NR == 1) first = $1 }
  END { if (NR != 2 || bad) { print "MISMATCH"; exit 1 } print "agree" }'
