#!/usr/bin/env bash
# Set-up, build, and the main job: the GPT of examples/gpt (a GPT-2-style
# transformer written with libtorch modules, 834k parameters, byte-level,
# context 64) trained on Debian's fortune cookies by 4 in-process ranks
# under ZeRO stages 0, 1, 2 and 3 (fp32, AdamW, 200 steps of 16 x 64 bytes
# each), through zest::TorchModule. Prints the loss and validation loss as
# they fall, each rank's memory by category against the memory estimator,
# and a sample of generated text per stage; then checks that the final
# validation loss is the same at every stage to the last bit, and that every
# rank's memory matched the estimate. Then the measured memory of stages 0-3
# on 1, 2, 4 and 8 ranks against the estimator (examples/memory_compare), as
# tables, Markdown and an SVG chart in the build directory.
#
# Act 2: the trained model goes out as a Hugging Face directory and a LoRA
# fine-tune at stage 3 starts from it, exporting again with the adapters
# merged.
#
# About 2 minutes for the four trainings on 2 cores, and 20 s for the
# fine-tune, after the build.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${ZEST_BUILD_DIR:-$root/build}"
# The engine's informational lines (stage 3's prefetch order being
# re-recorded) would interleave with the table; warnings and errors still show.
export ZEST_LOG_LEVEL="${ZEST_LOG_LEVEL:-warn}"

"$root/scripts/setup.sh"
cmake -S "$root" -B "$build" -G Ninja ${ZEST_CMAKE_ARGS:-} >/dev/null
targets=$(cmake --build "$build" --target help)
if ! grep -q '^gpt:' <<<"$targets"; then
  echo "demo.sh: the build has no examples/gpt: CMake did not find libtorch (libtorch-dev, which" \
       "scripts/setup.sh installs), or ZEST_TORCH is OFF" >&2
  exit 1
fi
cmake --build "$build" -j "$(nproc)" --target zest-info gpt memory_compare

"$build/tools/zest-info"
echo
log="$build/demo_gpt.log"
start=$SECONDS
pretrained="$build/demo_gpt_hf"
"$build/examples/gpt/gpt" --ranks 4 --stages 0,1,2,3 --steps 200 --batch 16 --print-every 50 --eval-every 50 \
  --sample-bytes 240 --export-hf "$pretrained" | tee "$log"
echo "(trained in $((SECONDS - start)) s)"

# The same validation loss at every stage, to the last bit (printed with 17
# significant digits, which round-trip a double), and every rank's model
# states equal to the estimator's, category by category.
losses=$(grep '^final validation loss, stage' "$log" | awk '{print $NF}' | sort -u)
if [ "$(grep -c '^final validation loss, stage' "$log")" -ne 4 ] || [ "$(echo "$losses" | wc -l)" -ne 1 ]; then
  echo "demo.sh: FAILED: the final validation losses differ across stages:" >&2
  grep '^final validation loss, stage' "$log" >&2
  exit 1
fi
if grep -q 'differ' "$log"; then
  echo "demo.sh: FAILED: a rank's memory differs from the estimate, or the stages' samples differ (see above)" >&2
  exit 1
fi
echo "demo.sh: stages 0-3 reach the same validation loss, $losses, bit for bit; memory = estimate on every rank"

# Act 2: the model just trained, exported as a Hugging Face directory
# (config.json and model.safetensors, bf16), is where a fine-tune starts:
# loaded by 2 ranks at stage 3, each reading its own shard of the file, the
# base frozen (sharded in the compute dtype, no gradient or optimizer state)
# and rank-8 adapters trained on its projections, then exported again with
# the adapters merged into the weights.
echo
echo "== act 2: fine-tune $pretrained with LoRA (rank 8) at stage 3 on 2 ranks =="
ls -l "$pretrained"
tuned_log="$build/demo_gpt_lora.log"
"$build/examples/gpt/gpt" --hf "$pretrained" --ranks 2 --stage 3 --lora 8 --lora-alpha 16 --steps 60 --batch 16 \
  --lr 2e-3 --warmup 5 --print-every 20 --eval-every 30 --sample-bytes 120 --export-hf "$build/demo_gpt_lora_hf" \
  | tee "$tuned_log"
first=$(grep 'validation loss' "$tuned_log" | head -n1 | awk '{print $5}')
pretrained_loss=$(printf '%.4f' "$losses")
# bf16 weights: the loaded model's loss is the trained one's to about 1e-2.
if ! awk -v a="$first" -v b="$pretrained_loss" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d < 0.02) }'; then
  echo "demo.sh: FAILED: the fine-tune starts at validation loss $first, not the pretrained model's $pretrained_loss" >&2
  exit 1
fi
echo "demo.sh: the fine-tune starts from the exported model (validation loss $first against $pretrained_loss)"
echo
"$build/examples/memory_compare/memory_compare" --markdown "$build/memory_compare.md" --svg "$build/memory_compare.svg"
