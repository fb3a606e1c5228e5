"""`dapo-suite demo` (what `make demo` runs): DAPO on the embedded model on a CPU, start to finish.

Trains SmolLM2-135M-Instruct with the `dapo` switches at the `tiny-cpu` scale on the built-in arithmetic task,
measures held-out accuracy before and after, draws the training-dynamics plot and prints what to run next.
A rerun continues the same run directory where it stopped.
"""

from __future__ import annotations

from pathlib import Path

import click

from dapo_suite.config import resolve_config


def run_demo(out: str = "runs/demo", max_steps: int | None = None) -> None:
    from dapo_suite.plots import plot_run
    from dapo_suite.trainer import DAPOTrainer

    overrides = {"out": out, **({"max_steps": max_steps} if max_steps else {})}
    config = resolve_config(["dapo"], overrides)
    resume = (Path(out) / "metrics.jsonl").is_file()
    click.echo(f"DAPO on the embedded model: {config.max_steps} steps, {config.train_batch_size} prompts x "
               f"{config.group_size} responses per step, run directory {out}" + (" (resuming)" if resume else ""))
    summary = DAPOTrainer(config, resume=resume).fit()
    png = plot_run(Path(out))
    before, after = summary["before"], summary["after"]
    click.echo(f"\nheld-out accuracy (avg@{config.val_n} over {before['problems']} problems): "
               f"{before['acc']:.3f} -> {after['acc']:.3f} ({(after['acc'] - before['acc']) * 100:+.1f} points)")
    click.echo(f"training dynamics: {png}\ncheckpoint: {Path(out) / 'checkpoint-last'}")
    click.echo(f"next: dapo-suite serve --model {Path(out) / 'checkpoint-last'}")
