"""The paper's ablation ladder at small scale (its Table 1): every rung from `grpo` to `dapo`, same budget, same
seeds, same held-out split, one run directory each, then one table.

A rung that finished is skipped on a rerun and a rung that was interrupted resumes from its checkpoint. The
held-out accuracy before training is a property of the starting model, the split and the seed, so it is
measured once (by the first rung) and copied to the others.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from dapo_suite.config import LADDER, resolve_config
from dapo_suite.metrics import read_metrics
from eval.metrics import confidence_interval_95

TABLE_FILE = "ladder.md"


def run_ladder(out: Path, rungs: list[str], overrides: dict[str, Any]) -> Path:
    """Train every rung into out/<rung> and write out/ladder.md and out/ladder.json; return the table's path."""
    from dapo_suite.plots import plot_run
    from dapo_suite.trainer import DAPOTrainer

    unknown = [rung for rung in rungs if rung not in LADDER]
    if unknown:
        raise ValueError(f"not a rung of the ladder: {', '.join(unknown)} (rungs: {', '.join(LADDER)})")
    out.mkdir(parents=True, exist_ok=True)
    before = None
    for index, rung in enumerate(rungs, 1):
        run_dir = out / rung
        config = resolve_config([rung], {**overrides, "out": str(run_dir)})
        summary_path = run_dir / "summary.json"
        summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
        if "after" in summary:
            click.echo(f"[{index}/{len(rungs)}] {rung}: finished earlier, skipped")
            before = before or summary.get("before")
            continue
        if before and "before" not in summary:
            run_dir.mkdir(parents=True, exist_ok=True)
            summary_path.write_text(json.dumps({"before": before}, indent=2))
        click.echo(f"[{index}/{len(rungs)}] {rung}: {config.max_steps} steps -> {run_dir}")
        summary = DAPOTrainer(config, resume=(run_dir / "metrics.jsonl").is_file()).fit()
        plot_run(run_dir)
        before = before or summary.get("before")
    rows = [rung_result(out / rung, rung) for rung in rungs]
    (out / "ladder.json").write_text(json.dumps(rows, indent=2))
    table_path = out / TABLE_FILE
    table_path.write_text(ladder_table(rows, overrides) + "\n")
    return table_path


def rung_result(run_dir: Path, rung: str) -> dict[str, Any]:
    """The figures the table shows for one finished rung."""
    summary = json.loads((run_dir / "summary.json").read_text())
    steps = [r for r in read_metrics(run_dir) if "reward/acc" in r]
    last = steps[-3:]  # the last few steps: single steps are noisy at 4 prompts per step

    def mean(key: str) -> float:
        return sum(r.get(key, 0.0) for r in last) / len(last)

    after = summary["after"]
    return {
        "rung": rung,
        "steps": len(steps),
        "before": summary["before"]["acc"],
        "after": after["acc"],
        "after_stderr": after["acc_stderr"],
        "heldout_len": after["response_len_mean"],
        "heldout_truncated": after["truncated"],
        "heldout_format_rate": after["format_rate"],
        "entropy_last": mean("actor/entropy"),
        "train_acc_last": mean("reward/acc"),
        "clip_upper_last": mean("actor/clipfrac_upper"),
        "minutes": sum(r.get("perf/step_seconds", 0.0) for r in steps) / 60,
    }


def ladder_table(rows: list[dict[str, Any]], overrides: dict[str, Any]) -> str:
    budget = ", ".join(f"{k}={v}" for k, v in overrides.items() if v is not None) or "preset defaults"
    lines = [f"Settings: tiny-cpu scale, {budget}. Held-out accuracy is avg@n over the held-out split, with a 95 % "
             "interval; entropy, train accuracy and clip fraction are means over the last 3 steps.", "",
             "| preset | held-out acc (%) before -> after | change | held-out length (tokens) | truncated (%) "
             "| entropy | train acc (%) | upper clip frac | minutes |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        low, high = confidence_interval_95(row["after"], row["after_stderr"])
        lines.append(
            f"| {row['rung']} | {100 * row['before']:.1f} -> **{100 * row['after']:.1f}** ({100 * low:.0f}-"
            f"{100 * high:.0f}) | {100 * (row['after'] - row['before']):+.1f} | {row['heldout_len']:.1f} | "
            f"{100 * row['heldout_truncated']:.1f} | {row['entropy_last']:.2f} | {100 * row['train_acc_last']:.0f} | "
            f"{row['clip_upper_last']:.4f} | {row['minutes']:.1f} |")
    return "\n".join(lines)
