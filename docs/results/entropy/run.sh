#!/usr/bin/env bash
# The entropy comparison (docs/results/entropy/README.md): grpo vs +clip-higher, paired by seed.
# Usage: docs/results/entropy/run.sh [OUT] [SEEDS]   (SEEDS 1 = the pilot; 5 = the comparison)
# Rerun the same command to resume after a stop: finished runs are skipped, an interrupted one resumes, and a
# larger SEEDS adds seeds to the same ladder.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-runs/entropy}
seeds=${2:-5}
.venv/bin/dapo-suite train ladder \
  --presets docs/results/entropy/grpo.yaml,docs/results/entropy/clip-higher.yaml --seeds "$seeds" --max-steps 30 \
  --set train_batch_size=8 --set gen_batch_size=8 --set group_size=8 --set mini_batch_size=1 \
  --set micro_batch_size=8 --set max_response_length=64 --set overlong_buffer_len=16 --set heldout_size=50 \
  --set eval_every=10 --set val_n=2 --set keep_checkpoints=1 --out "$out"
