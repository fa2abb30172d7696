#!/bin/sh
# The llama example fine-tuning on tokenized data through its command line:
# `sft_check.sh LLAMA_BINARY`. Writes packed, instruction-masked JSONL
# (tests/tools/token_data_writer.py), then checks
#   1. ranks and micro-batches: 1 rank x 4 micro-batches at stage 0, 2 x 2 at
#      stage 3, 4 x 1 at stage 2 and a tp 2 mesh of 2 x 2 at stage 3 end at
#      the same validation loss within 1e-5 relative (the global batch's
#      trained-token mean, summed in other orders; the mesh's vocabulary-
#      parallel loss masks the -100 targets);
#   2. exact resume: 3 steps, a checkpoint, 3 more from it end with the bits
#      of 6 uninterrupted steps (the data position follows the step count),
#      and a resume reading other rows (another --seed) is refused by name;
#   3. --warmup with --lr-decay cosine gives transformers' rates;
#   4. --epochs 2 runs the steps of two epochs;
#   5. --format text: text JSONL tokenized with Mistral v0.3's tokenizer.model
#      (tests/tokenizer/mistral_v03) trains to the bits of --format jsonl
#      over the ids and labels hf_tokenizer_reference.py computed for the
#      same records (tokenizers' BPE, TRL's prompt masking); without
#      SentencePiece in the build, --format text is refused by name instead;
#   6. --attention-tile and --mlp-tile (attention in tiles with an online
#      softmax, the MLP in tiles with recompute) on packed rows at stage 3
#      end at the untiled run's validation loss within 1e-5 relative (the
#      same sums in other orders).
# Exit 0 and "agree" when all hold.
set -eu
bin=$1
root=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 "$root/tests/tools/token_data_writer.py" jsonl "$work/train.jsonl" --vocab 256 --records 160
python3 "$root/tests/tools/token_data_writer.py" jsonl "$work/val.jsonl" --vocab 256 --records 24
common="--format jsonl --data $work/train.jsonl --val-data $work/val.jsonl --max-seq-len 64 --packing --batch 8
        --eval-every 100"
final() { sed -n 's/^final validation loss, stage [0-3]: //p'; }
run() {
  "$bin" $common "$@" > "$work/out.txt" 2>&1 || { cat "$work/out.txt" >&2; echo "MISMATCH: $* failed" >&2; exit 1; }
  final < "$work/out.txt"
}

a=$(run --ranks 1 --accum 4 --stage 0 --steps 6)
b=$(run --ranks 2 --accum 2 --stage 3 --steps 6)
c=$(run --ranks 4 --accum 1 --stage 2 --steps 6)
d=$(run --ranks 4 --tp 2 --accum 2 --stage 3 --steps 6)
echo "1 x 4 stage 0: $a; 2 x 2 stage 3: $b; 4 x 1 stage 2: $c; tp 2 x dp 2 stage 3: $d"
echo "$b $c $d" | tr ' ' '\n' | awk -v one="$a" '
  NF { n++; e = ($1 - one) / one; if (e < 0) e = -e; if (e > 1e-5) bad = 1 }
  END { if (n != 3 || one == "" || bad) { print "MISMATCH: ranks"; exit 1 } }'

run --ranks 2 --stage 3 --steps 3 --save "$work/ckpt" > /dev/null
resumed=$(run --ranks 2 --stage 3 --steps 3 --load "$work/ckpt")
whole=$(run --ranks 2 --stage 3 --steps 6)
echo "resumed at step 3: $resumed; uninterrupted: $whole"
[ -n "$whole" ] && [ "$resumed" = "$whole" ] || { echo "MISMATCH: resume"; exit 1; }
# Another seed would read other rows from step 3 on: refused by name.
if "$bin" $common --ranks 2 --stage 3 --steps 1 --load "$work/ckpt" --seed 99 > "$work/out.txt" 2>&1; then
  echo "MISMATCH: a resume with another --seed was not refused"; exit 1
fi
grep -q "the rows of each step would differ" "$work/out.txt" || { cat "$work/out.txt"; echo "MISMATCH: refusal"; exit 1; }

# --warmup 2 --lr-decay cosine over 6 steps: 0, lr/2, lr, then half a cosine
# (transformers' get_cosine_schedule_with_warmup at lr 1e-3).
run --ranks 2 --stage 3 --steps 6 --print-every 1 --warmup 2 --lr-decay cosine > /dev/null
lrs=$(sed -n 's/^step .* lr \([0-9.e+-]*\) .*/\1/p' "$work/out.txt" | tr '\n' ' ')
echo "--warmup 2 --lr-decay cosine, lr by step: $lrs"
[ "$lrs" = "0.00e+00 5.00e-04 1.00e-03 8.54e-04 5.00e-04 1.46e-04 " ] || { echo "MISMATCH: schedule"; exit 1; }

run --ranks 2 --stage 1 --epochs 2 > /dev/null
steps=$(grep -c '^step .* epoch ' "$work/out.txt" || true)
plan=$(sed -n 's/.*, \([0-9]*\) steps an epoch of.*/\1/p' "$work/out.txt")
last=$(sed -n 's/.*training steps 0 to \([0-9]*\)$/\1/p' "$work/out.txt")
echo "--epochs 2: steps 0 to $last, epoch 0 of $plan steps; epoch 1 reached: $(grep -c ' epoch 1 ' "$work/out.txt" || true) lines"
[ -n "$last" ] && [ "$last" -ge $((plan + 1)) ] && grep -q ' epoch 1 ' "$work/out.txt" || { echo "MISMATCH: epochs"; exit 1; }

tiled=$(run --ranks 2 --stage 3 --steps 6 --attention-tile 16 --mlp-tile 24 --recompute)
echo "--attention-tile 16 --mlp-tile 24 --recompute: $tiled; untiled: $whole"
awk -v a="$tiled" -v b="$whole" 'BEGIN { e = (a - b) / b; if (e < 0) e = -e; exit !(a != "" && e <= 1e-5) }' ||
  { echo "MISMATCH: tiles"; exit 1; }

fixture="$root/tests/tokenizer/mistral_v03"
cat > "$work/config.json" <<'JSON'
{"model_type": "mistral", "hidden_size": 32, "intermediate_size": 48, "num_attention_heads": 4,
 "num_key_value_heads": 2, "num_hidden_layers": 1, "vocab_size": 32768, "max_position_embeddings": 128,
 "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null, "tie_word_embeddings": false}
JSON
text() {
  "$bin" --config "$work/config.json" --max-seq-len 32 --packing --batch 2 --eval-every 100 --ranks 2 --stage 3 \
    --steps 3 "$@" > "$work/out.txt" 2>&1 || { cat "$work/out.txt" >&2; echo "MISMATCH: $* failed" >&2; exit 1; }
  final < "$work/out.txt"
}
if text --format text --tokenizer "$fixture" --data "$fixture/records.jsonl" --val-data "$fixture/records.jsonl" \
     > "$work/text.txt" 2> /dev/null; then
  from_text=$(cat "$work/text.txt")
  from_ids=$(text --format jsonl --data "$fixture/expected_first.jsonl" --val-data "$fixture/expected_first.jsonl")
  echo "--format text: $from_text; --format jsonl of the reference's ids: $from_ids"
  [ -n "$from_text" ] && [ "$from_text" = "$from_ids" ] || { echo "MISMATCH: text"; exit 1; }
else
  grep -q "libsentencepiece-dev" "$work/out.txt" || { cat "$work/out.txt"; echo "MISMATCH: text refusal"; exit 1; }
  echo "--format text: refused, this build has no SentencePiece"
fi
echo agree
