#!/usr/bin/env bash
# zest-ckpt and zest-estimate against hostile command lines (issue 12,
# findings 3, 6, 8, 14): export onto its own input, `latest`, the manifest, a
# device, "" or a directory is refused before a byte is written; inspect shows
# a missing shard; reshard refuses a world size that is a typo and reshards in
# place safely; a units file nested 100,000 deep is an error, not a crash.
# Every refusal must leave the checkpoint byte for byte as it was.
set -euo pipefail
mlp="$1"
ckpt="$2"
estimate="$3"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }
# The checkpoint's files and their hashes (the lock file's holder text aside).
state() { (cd "$work/ck" && find . -path ./.zest-lock -prune -o -type f -print0 | sort -z | xargs -0 sha256sum); }
# Runs a command that must fail with exit status 1 or 2 (not a signal) and
# print `expected` on stderr, leaving the checkpoint unchanged.
refused() {
  local expected="$1"; shift
  local before rc=0
  before="$(state)"
  "$@" >"$work/out" 2>"$work/err" || rc=$?
  [ "$rc" -eq 1 ] || [ "$rc" -eq 2 ] || fail "'$*' exited $rc, expected a refusal; stderr: $(cat "$work/err")"
  grep -qF -- "$expected" "$work/err" || fail "'$*': stderr lacks '$expected': $(cat "$work/err")"
  [ "$before" = "$(state)" ] || fail "'$*' changed the checkpoint"
  "$ckpt" verify "$work/ck" >/dev/null || fail "'$*' left a checkpoint that does not verify"
}

"$mlp" --ranks 2 --stage 1 --steps 2 --print-every 2 --save "$work/ck" >/dev/null
"$ckpt" verify "$work/ck" >/dev/null
step="$work/ck/step_000002"

# Finding 3: export onto its own input, checked before writing.
msg="writing it would destroy the checkpoint being read"
refused "$msg" "$ckpt" export "$work/ck" "$step/rank_00000.bin"
refused "$msg" "$ckpt" export "$work/ck" "$step/manifest.json"
refused "$msg" "$ckpt" export "$work/ck" "$work/ck/latest"
refused "$msg" "$ckpt" export "$work/ck" "$step"
refused "$msg" "$ckpt" export "$work/ck" "$work/ck"
mkdir "$work/ck/step_000099" && cp "$step/manifest.json" "$work/ck/step_000099/"
refused "inside the checkpoint directory" "$ckpt" export "$work/ck" "$work/ck/step_000099/model.safetensors"
rm -r "$work/ck/step_000099"
ln "$step/rank_00001.bin" "$work/hardlink.bin"
refused "the same file as" "$ckpt" export "$work/ck" "$work/hardlink.bin"
refused "is an empty path" "$ckpt" export "$work/ck" ""
mkdir "$work/adir"
refused "exists and is a directory" "$ckpt" export "$work/ck" "$work/adir"
[ -z "$(ls -A "$work/adir")" ] || fail "export wrote into the directory"
refused "exists and is a character device" "$ckpt" export "$work/ck" /dev/null
[ -c /dev/null ] || fail "/dev/null is no longer a device"
# A link at the output is refused; one at the old fixed temp name is not followed.
echo precious >"$work/victim"
ln -s "$work/victim" "$work/link.safetensors"
refused "exists and is a symbolic link" "$ckpt" export "$work/ck" "$work/link.safetensors"
ln -s "$work/victim" "$work/m.safetensors.tmp"
"$ckpt" export "$work/ck" "$work/m.safetensors" >/dev/null
[ "$(cat "$work/victim")" = precious ] || fail "export wrote through a planted link"

# Finding 6: inspect shows a missing shard as MISSING, and fails.
cp -a "$work/ck" "$work/ck2"
rm "$work/ck2/step_000002/rank_00001.bin"
rc=0; "$ckpt" inspect "$work/ck2" >"$work/out" 2>"$work/err" || rc=$?
[ "$rc" -eq 1 ] || fail "inspect of a checkpoint missing a shard exited $rc"
grep -q "rank_00001.bin .*MISSING" "$work/out" || fail "inspect does not show the missing shard: $(cat "$work/out")"
grep -q "1 of 2 shard files of '.*' are missing" "$work/err" || fail "inspect's error: $(cat "$work/err")"

# Finding 14: reshard --world bounds, checked before anything is created.
refused "reshard --world 1048576: the checkpoint holds" "$ckpt" reshard "$work/ck" "$work/huge" --world 1048576
[ ! -e "$work/huge" ] || fail "reshard --world 1048576 created its output"
refused "--world: Value 2147483648 not in range 1 to 1048576" "$ckpt" reshard "$work/ck" "$work/huge" --world 2147483648
[ ! -e "$work/huge" ] || fail "reshard --world 2147483648 created its output"
refused "--world '2147483648': expected a whole number" "$estimate" --params 1e9 --world 2147483648

# Finding 4: reshard in place replaces the tag atomically and still loads.
"$ckpt" reshard "$work/ck" "$work/ck" --world 4 --stage 2 >/dev/null
"$ckpt" verify "$work/ck" >/dev/null
"$ckpt" inspect "$work/ck" | grep -q "saved by    4 ranks at stage 2" || fail "in-place reshard did not take"
[ -z "$(find "$work/ck" -maxdepth 1 -name '.*' ! -name .zest-lock ! -name .)" ] || fail "leftovers in the root"
"$mlp" --ranks 4 --stage 2 --steps 1 --print-every 1 --load "$work/ck" | grep -q "resumed from .* at step 2"

# Finding 8: a units file nested 100,000 deep.
python3 -c 'print("[" * 100000 + "]" * 100000)' >"$work/deep.json"
refused "--units $work/deep.json: " "$estimate" --units "$work/deep.json" --world 8
# A bad line names the file and the line.
printf 'a 10\nb 12x\n' >"$work/units.txt"
refused "--units $work/units.txt: units line 2: '12x' is not a parameter count" "$estimate" --units "$work/units.txt" --world 8

# Finding 10: FIFOs where the tools read a file fail at once (timeout: a hang
# exits 124 and fails the check).
mkfifo "$work/fifo"
refused "is a FIFO (named pipe), not a regular file" timeout 20 "$estimate" --units "$work/fifo" --world 8
refused "is a FIFO (named pipe), not a regular file" timeout 20 "$mlp" --config "$work/fifo"
cp -a "$work/ck" "$work/ck3"
rm "$work/ck3/latest" && mkfifo "$work/ck3/latest"
refused "is a FIFO (named pipe), not a regular file" timeout 20 "$ckpt" inspect "$work/ck3"

echo "zest-ckpt hostile: all checks passed"
