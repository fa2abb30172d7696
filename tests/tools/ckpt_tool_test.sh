#!/usr/bin/env bash
# zest-ckpt end to end: the mlp example saves a 4-rank stage-2 checkpoint;
# inspect and verify read it; reshard writes a 2-rank stage-1 copy whose
# exported weights are byte-identical to the original's; the example resumes
# from the copy; a flipped byte makes verify fail naming the file.
set -euo pipefail
mlp="$1"
ckpt="$2"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

"$mlp" --ranks 4 --stage 2 --steps 4 --print-every 4 --save "$work/a"
# (outputs are captured first: grep -q would end the pipe early)
out="$("$ckpt" inspect "$work/a")"
grep -q "saved by    4 ranks at stage 2 (4 shard files)" <<<"$out"
"$ckpt" verify "$work/a"
"$ckpt" reshard "$work/a" "$work/b" --world 2 --stage 1
out="$("$ckpt" inspect "$work/b")"
grep -q "saved by    2 ranks at stage 1 (2 shard files)" <<<"$out"
"$ckpt" export "$work/a" "$work/a.safetensors" --dtype bf16
"$ckpt" export "$work/b" "$work/b.safetensors" --dtype bf16
cmp "$work/a.safetensors" "$work/b.safetensors"
out="$("$mlp" --ranks 2 --stage 1 --steps 2 --print-every 1 --load "$work/b")"
grep -q "resumed from .* at step 4" <<<"$out"

file="$work/a/step_000004/rank_00002.bin"
printf '\x7f' | dd of="$file" bs=1 seek=100 conv=notrunc status=none
if "$ckpt" verify "$work/a" 2>"$work/err"; then
  echo "verify passed a corrupted checkpoint" >&2
  exit 1
fi
grep -q "rank_00002.bin' is corrupt" "$work/err"
"$ckpt" bogus 2>/dev/null && exit 1 || [ $? -eq 2 ]
echo "zest-ckpt: all checks passed"
