#!/usr/bin/env bash
# The entropy comparison (docs/results/entropy/README.md): grpo vs +clip-higher, paired by seed, from a warm start.
# Usage: docs/results/entropy/run.sh [OUT] [SEEDS]   (SEEDS 1 = the pilot; 5 = the comparison)
# Rerun the same command to resume after a stop: finished runs are skipped, an interrupted one resumes, and a
# larger SEEDS adds seeds to the same ladder.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-runs/entropy}
seeds=${2:-5}
start=$out/warm-start
# 1. The warm start: the untrained model writes the `Answer:` line in ~5 % of samples, so at this scale most groups
#    are all wrong and nothing is learned for many steps. 7 DAPO steps on the curriculum's operations written in
#    words ("What is 3 plus 4?": the same skills, none of the problem texts the comparison trains and is held out on)
#    teach the format first. Both arms start from this checkpoint.
if [ ! -e "$start/summary.json" ] || ! grep -q '"after"' "$start/summary.json"; then
  resume=$([ -e "$start/checkpoint-last" ] && echo --resume || true)
  .venv/bin/dapo-suite train --preset tiny-cpu --set task=arithmetic-in-words --set seed=0 --max-steps 7 \
    --out "$start" $resume
fi
# 2. The comparison on the arithmetic curriculum, from the warm start: 4 prompts x 16 samples a step, mini-batches of
#    one prompt and 2 epochs (8 optimiser updates per rollout batch), 30 steps.
.venv/bin/dapo-suite train ladder \
  --presets docs/results/entropy/grpo.yaml,docs/results/entropy/clip-higher.yaml --seeds "$seeds" --max-steps 30 \
  --model "$start/checkpoint-last" --scale tiny-cpu \
  --set train_batch_size=4 --set gen_batch_size=4 --set group_size=16 --set mini_batch_size=1 --set ppo_epochs=2 \
  --set micro_batch_size=16 --set max_response_length=64 --set overlong_buffer_len=16 --set heldout_size=50 \
  --set eval_every=10 --set val_n=2 --set keep_checkpoints=1 --out "$out"
