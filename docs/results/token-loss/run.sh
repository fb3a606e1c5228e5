#!/usr/bin/env bash
# Token-level against sample-level loss with longer responses (the DAPO paper's Figure 4), paired by seed:
# docs/results/token-loss/README.md.
# Usage: DAPO_SUITE_DATA=<raw data root> docs/results/token-loss/run.sh [OUT] [SEEDS] [WORKERS]
#   SEEDS 1 = the pilot; WORKERS ladder processes split the runs (2 on 2 cores: one thread each).
# Rerun the same command to resume after a stop: finished runs are skipped, an interrupted one resumes, and a
# larger SEEDS adds seeds to the same ladder.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-runs/token-loss}
seeds=${2:-1}
workers=${3:-1}
# 1. GSM8K's 2-step train problems and the arithmetic set (the gsm8k-cpu preset's data), decontaminated.
.venv/bin/dapo-suite data build --input gsm8k --input arithmetic --max-solution-steps 2 --out runs/data/gsm8k
# 2. The warm start: the default run's first 12 steps on the arithmetic task teach the `Answer:` line (the untrained
#    model is right on 0 of 256 GSM8K samples: docs/results/gsm8k/README.md). Both arms start from it. 12, not 7:
#    chosen on the GSM8K held-out split (13 % right from the 12-step start, 2 % from the 7-step one; README.md).
.venv/bin/dapo-suite train --resume --max-steps 12 --out "$out/warm-start"
# 3. The comparison at gsm8k-cpu scale (responses of 80-120 tokens that grow with training, up to 256): 4 prompts
#    x 8 samples a step, mini-batches of one prompt and 2 epochs (8 optimiser updates per rollout batch, as the
#    entropy comparison), 30 steps.
ladder=(.venv/bin/dapo-suite train ladder
  --presets docs/results/token-loss/sample-mean.yaml,docs/results/token-loss/token-mean.yaml --seeds "$seeds"
  --max-steps 30 --model "$out/warm-start/checkpoint-last" --scale gsm8k-cpu
  --set mini_batch_size=1 --set ppo_epochs=2 --set heldout_size=50 --set eval_every=10 --set keep_checkpoints=1
  --out "$out")
threads=$(( $(nproc) / workers )); threads=$(( threads > 0 ? threads : 1 ))
pids=()
for _ in $(seq "$workers"); do
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-$threads} "${ladder[@]}" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done  # the last worker to end wrote the whole table
exit $status
