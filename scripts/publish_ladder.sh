#!/usr/bin/env bash
# Copy a ladder's finished runs' small result files (plan, per-run metrics, summaries, configs; never checkpoints) into a results
# folder and rebuild its table, tests and plots there from those files alone:
#   scripts/publish_ladder.sh runs/ladder docs/results/ladder [PRESETS [SEEDS]]
# PRESETS (comma-separated) and SEEDS pick a subset, e.g. `dapo,gspo,cispo 2` for the successors' comparison.
set -euo pipefail
src=$1 dst=$2 presets=${3:-} seeds=${4:-}
mkdir -p "$dst"
"${BIN:-.venv/bin}/python" - "$src" "$dst" "$presets" "$seeds" <<'PY'
import json, shutil, sys
from pathlib import Path
from dapo_suite.train.run_folders import rung_name, run_path
src, dst, presets, seeds = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
plan = json.loads((src / "ladder_plan.json").read_text())
if presets:
    plan["presets"] = presets.split(",")
if seeds:
    plan["seeds"] = list(range(int(seeds)))
(dst / "ladder_plan.json").write_text(json.dumps(plan, indent=2) + "\n")
for preset in plan["presets"]:
    rung = rung_name(preset)
    for seed in plan["seeds"]:
        run = run_path(src, rung, seed)
        summary = run / "summary.json"
        if not summary.is_file() or "after" not in json.loads(summary.read_text()):
            continue  # not finished: a run writes its summary at the start and its "after" at the end
        target = run_path(dst, rung, seed)
        target.mkdir(parents=True, exist_ok=True)
        for name in ("metrics.jsonl", "summary.json", "config.yaml"):
            shutil.copy(run / name, target / name)
PY
"${BIN:-.venv/bin}/dapo-suite" train ladder --out "$dst" --report-only
