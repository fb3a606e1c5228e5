"""`dapo-suite train ladder` and `dapo-suite train effects`: studies of several runs, paired by seed, trained
by workers at once (dapo_suite.train.workers); `dapo-suite train` (train/cli.py) registers them."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from dapo_suite.core.cli_options import folder_option
from dapo_suite.train.config import LADDER


def worker_command(name: str, out: str, **options) -> list[str]:
    """The `dapo-suite train NAME` argv each worker runs: `--out OUT`, then each option as its flag (True: the
    flag alone; a list: the flag before each item; None, False and [] left out)."""
    argv = ["train", name, "--out", out]
    for key, value in options.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif isinstance(value, list):
            argv += [part for item in value for part in (flag, str(item))]
        elif value is not None and value is not False:
            argv += [flag, str(value)]
    return argv


def train_by_workers(name: str, out: str, options: dict, workers: int, configs: dict) -> None:
    """Train the planned runs (`configs`, plan_ladder's) by `workers` processes at once, each running
    `dapo-suite train NAME --out OUT` with `options` and taking the next run no other holds."""
    from dapo_suite.train.workers import run_workers

    command = worker_command(name, out, **options)
    run_workers(Path(out), command, workers, [Path(config.out) for config in configs.values()])


# `train ladder` and `train effects`: several runs at once (dapo_suite.train.workers)
workers_option = click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    metavar="N",
    help="Runs trained at once, each by a process of its own taking the next run no other holds. On a CPU "
    "each gets an equal share of the cores, pinned, a torch thread per core (--workers 2 on 2 cores). On one "
    "GPU they share it: start the CUDA MPS daemon first (nvidia-cuda-mps-control -d); 25 workers of the "
    "effects study ran on one H200 at 6-9 s a step each.",
)


@click.command()
@folder_option(
    "runs/ladder",
    "Ladder directory: OUT/<rung>/seed-<s>/ per run, plus ladder_plan.json, ladder.md, ladder.json, "
    "ladder.csv and ladder_dynamics.png.",
)
@click.option(
    "--presets",
    "presets_list",
    metavar="A,B,...",
    help=f"Comma-separated presets, one rung each, compared in this order (default: the paper's ladder, "
    f"{','.join(LADDER)}). Any preset works, e.g. --presets dapo,gspo,cispo; a .yaml path too.",
)
@click.option(
    "--seeds",
    type=click.IntRange(1, 20),
    metavar="N",
    help="Runs per rung, with seeds 0..N-1 shared by every rung (default 3).",
)
@click.option("--max-steps", type=int, help="Training steps per run (default: the tiny-cpu preset's).")
@click.option("--model", help="Starting model for every run (default: the embedded SmolLM2-135M-Instruct).")
@click.option(
    "--scale",
    metavar="PRESET",
    help="Scale preset under every rung, e.g. tiny-cpu (default: tiny-cpu for the embedded model only; "
    "give it with --model pointing at a checkpoint trained from the embedded model).",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config field for every run, e.g. --set group_size=8 (not a field the presets set, "
    "not the seed).",
)
@click.option(
    "--report-only",
    is_flag=True,
    help="Train nothing: rebuild the table, tests and plots from OUT's ladder_plan.json and the runs' "
    "metrics.jsonl (--presets and --seeds, if given, pick a subset).",
)
@click.option(
    "--keep-checkpoints",
    is_flag=True,
    help="Keep each finished run's checkpoints (by default deleted once the run finishes: the table "
    "needs the metrics alone, and each run of the embedded model holds ~3 GB of them).",
)
@workers_option
def ladder(
    out: str,
    presets_list: str | None,
    seeds: int | None,
    max_steps: int | None,
    model: str | None,
    scale: str | None,
    assignments,
    report_only: bool,
    keep_checkpoints: bool,
    workers: int,
) -> None:
    """Compare presets on the same task, budget and seeds: the paper's ablation ladder (its Table 1) by
    default.

    \b
    A rung is one preset: grpo, then one DAPO technique added per rung (+overlong-filter, +clip-higher,
    +soft-overlong, +token-loss), then dapo (+ dynamic sampling); or any list given with --presets. Every rung
    trains once per seed (0..N-1), each (rung, seed) in its own run directory, with the same model, data,
    held-out split and step budget; the held-out accuracy before training is measured once per seed and
    shared.

    \b
    The table (ladder.md, ladder.csv; everything in ladder.json): per rung, the mean and sample std across
    seeds of the held-out accuracy after training and of the last 3 steps' entropy, response length, share of
    zero-advantage groups before filtering, upper clip fraction and train accuracy. The tests: each rung
    against the one before it, against the first rung and against grpo (when it is a rung), paired by seed (d
    = B - A per seed): a paired t-test on the differences (N-1 degrees of freedom, 95 % interval) and an exact
    sign-flip permutation test over all 2^N sign patterns, whose smallest possible p is 2/2^N (0.25 with 3
    seeds: use 6 or more seeds to reach 5 %).
    The plots (ladder_dynamics.png): each figure per step, mean across seeds with a min-max band, one colour
    per rung.

    \b
    Examples:
      dapo-suite train ladder --seeds 3 --max-steps 8 --out runs/ladder
      dapo-suite train ladder --presets dapo,gspo,cispo --seeds 2 --max-steps 8 --out runs/successors
      dapo-suite train ladder --out runs/ladder --report-only     # the table again, from the metrics on disk
      dapo-suite report runs/ladder                               # report.md/.html with the table and plots
    A rerun (after a kill, or with more seeds) skips finished runs and resumes an interrupted one from its
    checkpoint. Workers: --workers N trains N runs at once (logs in OUT/workers/); the same command started on
    several machines sharing OUT's file system splits the runs the same way: each takes the next run no other
    worker holds.
      dapo-suite train ladder --seeds 4 --workers 2 --out runs/ladder   # two runs at once, one core each
    """
    from dapo_suite.train.config import parse_override
    from dapo_suite.train.ladder import DEFAULT_SEEDS, plan_ladder, run_ladder
    from dapo_suite.train.ladder_report import report_ladder

    presets = [name.strip() for name in presets_list.split(",") if name.strip()] if presets_list else None
    if presets_list is not None and not presets:
        raise click.UsageError("--presets: give at least one preset name, e.g. --presets dapo,gspo")
    try:
        if report_only:
            table = report_ladder(Path(out), presets, list(range(seeds)) if seeds else None)
        else:
            overrides = {
                key: value
                for key, value in {"max_steps": max_steps, "model": model}.items()
                if value is not None
            }
            overrides.update(
                parse_override(assignment) for assignment in assignments
            )  # null kept: it turns off
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
            if workers > 1:
                configs = plan_ladder(
                    Path(out), presets or list(LADDER), list(range(seeds or DEFAULT_SEEDS)), overrides, scale
                )
                options = {"presets": presets_list, "seeds": seeds, "scale": scale, "max_steps": max_steps}
                options |= {"model": model, "set": list(assignments), "keep_checkpoints": keep_checkpoints}
                train_by_workers("ladder", out, options, workers, configs)
                table = report_ladder(Path(out))
            else:
                table = run_ladder(
                    Path(out),
                    presets or list(LADDER),
                    list(range(seeds or DEFAULT_SEEDS)),
                    overrides,
                    scale,
                    keep_checkpoints,
                )
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    except RuntimeError as error:  # vLLM without a GPU, another model's checkpoint
        raise click.ClickException(str(error)) from error
    click.echo(table.read_text())
    click.echo(f"table: {table}")


@click.command()
@folder_option(
    "runs/effects",
    "Study directory: a ladder (OUT/<arm>/seed-<s>/ per run, ladder.md) plus effects.md, effects.json and "
    "effects.png.",
)
@click.option(
    "--seeds",
    type=click.IntRange(1, 20),
    default=5,
    show_default=True,
    metavar="N",
    help="Runs per arm, seeds 0..N-1, paired by seed.",
)
@click.option(
    "--arms",
    "arms_list",
    metavar="A,B,...",
    help="Train only these arms (default: all; e.g. --arms dapo --seeds 1 for one arm-seed); the table "
    "reads whatever has finished.",
)
@click.option("--report-only", is_flag=True, help="Train nothing: rebuild effects.md/.json/.png from OUT.")
@click.option("--keep-checkpoints", is_flag=True, help="Keep finished runs' checkpoints (default: delete).")
@click.option(
    "--study",
    default="dapo-effects",
    show_default=True,
    type=click.Choice(["dapo-effects", "tool", "clip-higher-16", "int8-rollouts"]),
    help="dapo-effects: DAPO against DAPO less each technique; tool: DAPO with the Python tool against "
    "DAPO on text alone (tools-cpu scale; docs/results/tools/); clip-higher-16: Clip-Higher at 16 "
    "updates a batch, the entropy of all sampled tokens (docs/results/clip-higher-16/); int8-rollouts: DAPO "
    "sampling from int8 weights against full precision (docs/results/int8-rollouts/).",
)
@workers_option
def effects(
    out: str,
    seeds: int,
    arms_list: str | None,
    report_only: bool,
    keep_checkpoints: bool,
    study: str,
    workers: int,
) -> None:
    """What each DAPO technique fixes: full DAPO against DAPO without it, on a setting where the problem
    appears.

    \b
    Arms (presets): dapo, dapo-no-clip-higher, dapo-no-dynamic-sampling, dapo-sample-loss, dapo-no-overlong,
    each at the effects-cpu scale (generated word problems, a 64-token response limit, 60 steps of 8 updates,
    held-out avg@8 and pass@8 every 20 steps). Each technique has one pre-registered figure and direction (the
    paper's): Clip-Higher keeps entropy up, dynamic sampling reaches held-out accuracy in fewer steps, the
    token-level loss keeps length from growing, overlong handling steadies training. Verdict per technique:
    shown when the paired t-test over seeds gives p < 0.05 in the paper's direction, else not shown.
    docs/results/effects/README.md holds the pre-registration and the committed results.

    \b
    Examples:
      dapo-suite train effects --seeds 5 --out runs/effects              # the whole study, resumable
      dapo-suite train effects --arms dapo --seeds 1 --out runs/effects  # one arm-seed
      dapo-suite train effects --out runs/effects --report-only          # the table from the runs on disk
      dapo-suite train effects --seeds 5 --workers 2 --out runs/effects  # two arm-seeds at once, a core each
      dapo-suite train effects --study tool --seeds 5 --workers 2 --out runs/tools   # the tool study
    A rerun skips finished runs and resumes an interrupted one; workers on one OUT split the runs (train
    ladder).
    """
    from dapo_suite.train.effects import STUDIES, run_effects, write_effects_outputs
    from dapo_suite.train.ladder import plan_ladder

    chosen = STUDIES[study]
    arms = [name.strip() for name in arms_list.split(",") if name.strip()] if arms_list else list(chosen.arms)
    if unknown := [arm for arm in arms if arm not in chosen.arms]:
        raise click.UsageError(f"--arms {','.join(unknown)}: the study's arms are {','.join(chosen.arms)}")
    try:
        if report_only:
            table = write_effects_outputs(Path(out))
        else:
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
            if workers > 1:
                configs = plan_ladder(Path(out), arms, list(range(seeds)), chosen.overrides, chosen.scale)
                options = {"seeds": seeds, "arms": ",".join(arms), "study": study}
                train_by_workers(
                    "effects", out, options | {"keep_checkpoints": keep_checkpoints}, workers, configs
                )
                table = write_effects_outputs(Path(out))
            else:
                table = run_effects(Path(out), arms, list(range(seeds)), keep_checkpoints, chosen)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    click.echo(table.read_text())
    click.echo(f"table: {table}")
