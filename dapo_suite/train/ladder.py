"""Presets compared over seeds at small scale: the paper's ablation ladder (its Table 1, `grpo` ... `dapo`,
one technique added per rung) or any list of presets (`dapo,gspo,cispo`), with the same model, data, held-out
split, step budget and seeds, then one table, seed-level paired tests and plots.

    dapo-suite train ladder --seeds 3 --max-steps 8 --out runs/ladder

OUT holds:
- `ladder_plan.json`: the presets, seeds and shared overrides of the command;
- `<rung>/seed-<s>/`: one training run per (rung, seed), with its metrics.jsonl, summary.json and config; its
  checkpoints (1.6 GB each for the embedded model) are deleted once it finishes unless `keep_checkpoints`;
- `ladder.md`, `ladder.json`, `ladder.csv`, `ladder_dynamics.png`: rebuilt from the plan and the runs'
  metrics.jsonl alone (`write_ladder_outputs`), so committing those files is enough to reproduce the table.

Every rung uses the same seeds 0..N-1, so rung B and rung A are compared seed by seed (a paired design: the
seed fixes the held-out split, the prompt order and the sampling stream). A run that finished is skipped on a
rerun and one that was interrupted resumes from its checkpoint. Several processes (workers) may run the ladder
on one OUT at once: a run is trained under its folder's lock, so each worker takes the runs no other one
holds. The held-out accuracy before training depends only on the starting model, the split, the seed and the
evaluation settings, so it is measured by the first run of each such setting and copied to the others.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError
from dapo_suite.core.lock import FolderBusy, output_lock
from dapo_suite.train.checkpoint import remove_checkpoints
from dapo_suite.train.config import TrainConfig, load_preset, resolve_config
from dapo_suite.train.ladder_report import write_ladder_outputs
from dapo_suite.train.run_folders import SHARED_FILE_WAIT, run_path, rung_name, write_plan

logger = logging.getLogger(__name__)

DEFAULT_SEEDS = 3
# What the held-out evaluation depends on; runs that agree on all of these share the measurement before
# training.
HELDOUT_FIELDS = (
    "model",
    "task",
    "train_file",
    "val_file",
    "heldout_size",
    "seed",
    "val_n",
    "val_temperature",
    "val_top_p",
    "eval_max_tokens",
    "dtype",
    "sampling_dtype",
    "device",
    "prompt_shots",
    "multi_turn",
    "max_assistant_turns",
    "max_tool_response_length",
    "tool_response_truncate_side",
    "tool_config_path",
)


def check_overrides(presets: list[str], overrides: dict[str, Any]) -> None:
    """The shared overrides may not touch what the ladder varies: a field one of the presets sets, or the
    seed."""
    if overrides.get("seed") is not None:
        raise UserError("--set seed: the ladder gives every run its seed from --seeds (seeds 0..N-1)")
    if overrides.get("out") is not None:
        raise UserError("--set out: use --out for the ladder's directory")
    for key, value in overrides.items():
        setters = [preset for preset in presets if key in load_preset(preset)]
        if value is not None and setters:
            raise UserError(
                f"--set {key}={value}: {key} is one of the switches the ladder compares "
                f"(set by {', '.join(setters)})"
            )


def run_ladder(
    out: Path,
    presets: list[str],
    seeds: list[int],
    overrides: dict[str, Any],
    scale: str | None = None,
    keep_checkpoints: bool = False,
) -> Path:
    """Train every (preset, seed) into out/<rung>/seed-<s>, seed after seed (so a partial ladder already has
    whole seeds), leaving the runs another worker holds to it, then write the table, tests and plots (of the
    runs finished so far); return the table's path. `scale`: a scale preset under
    every rung (by default tiny-cpu applies only to the embedded model, not to a checkpoint trained from it).
    A finished run's checkpoints are deleted unless `keep_checkpoints`: the table needs its metrics alone, and
    18 runs of the embedded model would otherwise hold ~56 GB."""
    configs = plan_ladder(out, presets, seeds, overrides, scale)
    befores: dict[tuple, dict] = {}
    for index, ((preset, seed), config) in enumerate(configs.items(), 1):
        run_dir, label = Path(config.out), f"[{index}/{len(configs)}] {rung_name(preset)} seed {seed}"
        try:
            with output_lock(
                run_dir
            ):  # several workers on one OUT: each run goes to the first that claims it
                summary = train_run(config, label, befores, keep_checkpoints)
        except FolderBusy as busy:
            logger.info(f"{label}: another worker is training it ({busy.holder}), left to it")
            continue
        if "before" in summary:
            befores.setdefault(heldout_key(config), summary["before"])
    with output_lock(out, wait_seconds=SHARED_FILE_WAIT):
        return write_ladder_outputs(out)


def plan_ladder(
    out: Path, presets: list[str], seeds: list[int], overrides: dict[str, Any], scale: str | None = None
) -> dict[tuple[str, int], TrainConfig]:
    """Every run's config, seed after seed, resolved before any run trains (a bad preset or value stops the
    ladder before hours of training, and before workers start), with OUT's plan written."""
    rungs = [rung_name(preset) for preset in presets]
    if len(set(rungs)) < len(rungs):
        raise UserError(f"--presets {','.join(presets)}: a rung appears twice")
    check_overrides(presets, overrides)
    configs = {
        (preset, seed): resolve_config(
            [scale, preset] if scale else [preset],
            {"seed": seed, "out": str(run_path(out, rung_name(preset), seed))},
            overrides,
        )
        for seed in seeds
        for preset in presets
    }
    with output_lock(out, wait_seconds=SHARED_FILE_WAIT):
        write_plan(
            out,
            {
                "presets": presets,
                "seeds": seeds,
                "overrides": overrides,
                **({"scale": scale} if scale else {}),
            },
        )
    return configs


def train_run(
    config: TrainConfig, label: str, befores: dict[tuple, dict], keep_checkpoints: bool = False
) -> dict:
    """Train one (rung, seed) unless it finished earlier (then its summary as it is); a run that another of
    the same held-out setting measured before training gets that measurement instead of repeating it. The
    checkpoints of a run it finishes are deleted unless `keep_checkpoints`."""
    from dapo_suite.train.trainer import DAPOTrainer

    run_dir = Path(config.out)
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    key = heldout_key(config)
    if "after" in summary:
        logger.info(f"{label}: finished earlier, skipped")
        return summary
    if key in befores and "before" not in summary:
        summary_path.write_text(json.dumps({"before": befores[key]}, indent=2))
    logger.info(f"{label}: {config.max_steps} steps -> {run_dir}")
    summary = DAPOTrainer(config, resume=(run_dir / "metrics.jsonl").is_file()).fit()
    if not keep_checkpoints and (freed := remove_checkpoints(run_dir)):
        logger.info(f"{label}: checkpoints deleted ({freed / 2**30:.1f} GiB; --keep-checkpoints keeps them)")
    return summary


def heldout_key(config: TrainConfig) -> tuple:
    return tuple(getattr(config, name) for name in HELDOUT_FIELDS)
