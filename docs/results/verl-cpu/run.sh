#!/usr/bin/env bash
# verl's own trainer on this CPU against the embedded trainer, same settings (docs/results/verl-cpu/README.md).
# Usage: docs/results/verl-cpu/run.sh [OUT]   (default runs/verl-cpu-compare; needs `make verl-cpu-env`)
# Rerun to resume: each side continues from its last checkpoint.
set -euo pipefail
cd "$(dirname "$0")/../../.."
out=${1:-runs/verl-cpu-compare}
# max_num_gen_batches 30 (tiny-cpu: 2): verl trains only on a full batch of mixed groups and stops the run when the
# bound is used up, and the untrained model gets ~6 % of its groups mixed; both trainers get the same bound.
settings=(--preset tiny-cpu --max-steps 3 --set seed=0 --set heldout_size=20 --set val_n=2 --set eval_every=3
          --set max_num_gen_batches=30)
resume() { [ -d "$1/checkpoints" ] || [ -e "$1/checkpoint-last" ] && echo --resume || true; }
# verl 0.9.1's V1 trainer: vLLM-CPU rollout server, FSDP2 update over gloo, DAPO preset at tiny-cpu scale
.venv/bin/dapo-suite train --backend verl --device cpu "${settings[@]}" --out "$out/verl" $(resume "$out/verl")
# the embedded trainer, same preset, seed, task split and validation
.venv/bin/dapo-suite train "${settings[@]}" --out "$out/embedded" $(resume "$out/embedded")
.venv/bin/python docs/results/verl-cpu/compare.py "$out/verl" "$out/embedded" > docs/results/verl-cpu/compare.md
for side in verl embedded; do
  mkdir -p "docs/results/verl-cpu/$side" && cp "$out/$side/metrics.jsonl" "$out/$side/config.yaml" "docs/results/verl-cpu/$side/"
done
cp "$out/verl/verl_command.sh" docs/results/verl-cpu/verl/
