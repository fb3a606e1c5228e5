#!/usr/bin/env bash
# The README's GSM8K result end to end (`make gsm8k`): data, two DAPO stages, GSM8K and MATH-500 before and after,
# the paired comparison. Every stage resumes when the script is rerun. Its figures and times:
# docs/results/gsm8k/README.md.
#   stage 1 (format): the first 7 steps of the default run (`tiny-cpu` scale, `dapo` switches) on the built-in
#     arithmetic task, where the untrained model is right often enough for dynamic sampling to find mixed groups,
#     so it learns to end with an `Answer:` line;
#   stage 2 (gsm8k): the `gsm8k-cpu` preset from stage 1's weights, on GSM8K's 2-step train problems (plus the
#     arithmetic set). From the untrained model, GSM8K alone gives no right answer to learn from (docs/train.md).
set -euo pipefail
BIN=${BIN:-.venv/bin}
OUT=${OUT:-runs/gsm8k-recipe}
EVAL=(--n 2 --temperature 1.0 --top-p 0.7 --dtype bfloat16 --batch-size 128 --seed 0)

"$BIN/dapo-suite" data build --input gsm8k --input arithmetic --max-solution-steps 2 --out runs/data/gsm8k
# float32 throughout, as the committed results were trained (before tiny-cpu's bf16 `auto`)
"$BIN/dapo-suite" train --resume --max-steps 7 --set sampling_dtype=null --set autocast_dtype=null --out "$OUT/format"
"$BIN/dapo-suite" train --resume --preset gsm8k-cpu --model "$OUT/format/checkpoint-last" --out "$OUT/gsm8k"
trained="$OUT/gsm8k/checkpoint-last"
"$BIN/dapo-suite" eval run gsm8k "${EVAL[@]}" --max-tokens 256 --out "$OUT/eval/gsm8k-before"
"$BIN/dapo-suite" eval run gsm8k "${EVAL[@]}" --max-tokens 256 --model "$trained" --out "$OUT/eval/gsm8k-after"
"$BIN/dapo-suite" eval run math500 "${EVAL[@]}" --max-tokens 512 --out "$OUT/eval/math500-before"
"$BIN/dapo-suite" eval run math500 "${EVAL[@]}" --max-tokens 512 --model "$trained" --out "$OUT/eval/math500-after"
"$BIN/dapo-suite" eval compare "$OUT/eval/gsm8k-before" "$OUT/eval/gsm8k-after"
"$BIN/dapo-suite" eval compare "$OUT/eval/math500-before" "$OUT/eval/math500-after"
