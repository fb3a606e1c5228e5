"""A ladder's report, rebuilt from OUT's plan and its runs' metrics.jsonl alone: per-rung means and stds over
seeds, seed-level paired tests between rungs (`comparisons`), and ladder.md, ladder.json, ladder.csv and
ladder_dynamics.png (`write_ladder_outputs`). The runs themselves are trained by `ladder.py`.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dapo_suite.core.lock import output_lock
from dapo_suite.core.stats import mean_and_std, paired_t_test, sign_flip_test
from dapo_suite.train.run_folders import SHARED_FILE_WAIT, read_plan, run_path, rung_name
from dapo_suite.train.run_log import read_metrics

TABLE_FILE = "ladder.md"
RESULTS_FILE = "ladder.json"
CSV_FILE = "ladder.csv"
PLOT_FILE = "ladder_dynamics.png"
LAST_STEPS = 3  # step figures are means over a run's last steps: one step of 4 prompts is noisy


def zero_advantage_share(record: dict) -> float | None:
    """Share of the step's sampled groups whose rewards were all equal (zero advantage, no gradient), counted
    before dynamic sampling filters them."""
    sampled = sum(record.get(f"sampling/groups_{kind}", 0) for kind in ("all_correct", "all_wrong", "mixed"))
    zero = record.get("sampling/groups_zero_advantage")
    return zero / sampled if zero is not None and sampled else None


# Per-step quantities read from a training record (None where the step did not log it, e.g. no update).
STEP_SERIES: dict[str, Callable[[dict], float | None]] = {
    "train_acc": lambda record: record.get("reward/acc"),
    "entropy": lambda record: record.get("actor/entropy"),
    "response_len": lambda record: record.get("response_len/mean"),
    "zero_adv_share": zero_advantage_share,
    "clip_upper": lambda record: record.get("actor/clipfrac_upper"),
}


@dataclass(frozen=True)
class Measure:
    label: str
    percent: bool  # shown x100 (and differences in points)
    digits: int


# The per-run figures of the table, each tested between rungs: held-out accuracy after training, then the
# last steps' mean of every step series.
MEASURES = {
    "heldout_acc": Measure("held-out acc after (%)", True, 1),
    "entropy": Measure("entropy (nats/token)", False, 2),
    "response_len": Measure("response length (tokens)", False, 1),
    "zero_adv_share": Measure("zero-advantage groups before filtering (%)", True, 0),
    "clip_upper": Measure("upper clip frac", False, 4),
    "train_acc": Measure("train acc (%)", True, 0),
}
PANELS = {
    "heldout_acc": "held-out accuracy (avg@n)",
    "train_acc": "train-sample accuracy",
    "entropy": "entropy (nats/token)",
    "response_len": "response length (tokens)",
    "zero_adv_share": "zero-advantage groups before filtering",
    "clip_upper": "upper clip fraction",
}


@dataclass
class RunRecord:
    """What the table needs from one run's metrics.jsonl."""

    rung: str
    seed: int
    steps: list[dict]  # one record per training step
    heldout: list[tuple[int, float]]  # (step, held-out accuracy) of every evaluation it logged
    before: float | None  # the held-out accuracy at step 0, when this run measured it
    after: float | None  # the held-out accuracy after training; None while the run is unfinished
    figures: dict[str, float] = field(default_factory=dict)


def read_run(run_dir: Path, rung: str, seed: int) -> RunRecord:
    """The evaluations before and after training are records with `val/acc` and no training metrics (step 0
    and the last step); evaluations during training (`eval_every`) sit in the step's own record."""
    records = read_metrics(run_dir)
    steps = [r for r in records if "reward/acc" in r]
    evaluations = [r for r in records if "val/acc" in r and "reward/acc" not in r]
    before = next((r["val/acc"] for r in evaluations if r["step"] == 0), None)
    summary_path = run_dir / "summary.json"
    if (
        before is None and summary_path.is_file()
    ):  # measured by another rung of the seed, copied to this summary
        before = json.loads(summary_path.read_text()).get("before", {}).get("acc")
    after = next((r["val/acc"] for r in reversed(evaluations) if r["step"] > 0), None)
    run = RunRecord(
        rung, seed, steps, [(r["step"], r["val/acc"]) for r in records if "val/acc" in r], before, after
    )
    run.figures = {"heldout_acc": after if after is not None else math.nan}
    for name, value in STEP_SERIES.items():
        last = [v for v in map(value, steps[-LAST_STEPS:]) if v is not None]
        run.figures[name] = statistics.fmean(last) if last else math.nan
    run.figures["minutes"] = sum(r.get("perf/step_seconds", 0.0) for r in steps) / 60
    return run


def comparisons(rungs: list[str]) -> list[tuple[str, str]]:
    """(A, B) pairs to test B against: each rung against the one before it, then against the first rung (the
    baseline: `grpo` in the paper's ladder, `dapo` in `--presets dapo,gspo,cispo`) and against `grpo` when it
    is among the rungs (a pair already listed, in either order, is not repeated)."""
    pairs = list(zip(rungs[:-1], rungs[1:], strict=True))
    for baseline in dict.fromkeys([*rungs[:1], *(["grpo"] if "grpo" in rungs else [])]):
        pairs += [(baseline, rung) for rung in rungs if rung != baseline]
    unique: list[tuple[str, str]] = []
    for a, b in pairs:
        if {a, b} not in [set(pair) for pair in unique]:
            unique.append((a, b))
    return unique


def ladder_results(
    out: Path, presets: list[str] | None = None, seeds: list[int] | None = None
) -> dict[str, Any]:
    """Per-rung means and stds across seeds, per-seed figures and the paired tests, from OUT's plan and
    runs."""
    plan = read_plan(out)
    rungs = [rung_name(preset) for preset in presets or plan["presets"]]
    seeds = list(seeds or plan["seeds"])
    runs, in_progress, missing = {}, {}, []
    for rung in rungs:
        for seed in seeds:
            run_dir = run_path(out, rung, seed)
            run = read_run(run_dir, rung, seed) if (run_dir / "metrics.jsonl").is_file() else None
            if run is None or run.after is None:
                missing.append(f"{rung} seed {seed}")
                if run is not None and run.steps:  # plotted, not tabled: a ladder can be watched as it trains
                    in_progress[rung, seed] = run
            else:
                runs[rung, seed] = run
    # "before" was measured by one run per seed and copied to the others' summary.json, not their metrics.
    seed_before = {run.seed: run.before for run in runs.values() if run.before is not None}
    rows = []
    for rung in rungs:
        finished = [runs[rung, seed] for seed in seeds if (rung, seed) in runs]
        befores = [run.before if run.before is not None else seed_before.get(run.seed) for run in finished]
        befores = [value for value in befores if value is not None]
        row: dict[str, Any] = {
            "rung": rung,
            "seeds": [run.seed for run in finished],
            "steps": [len(run.steps) for run in finished],
            "before": statistics.fmean(befores) if befores else math.nan,
        }
        for name in [*MEASURES, "minutes"]:
            values = [run.figures[name] for run in finished]
            measured = [value for value in values if not math.isnan(value)]  # NaN: not logged (no update)
            mean, std = mean_and_std(measured) if measured else (math.nan, math.nan)
            row[name] = {"mean": mean, "std": std, "per_seed": values}
        rows.append(row)
    tests = []
    for a, b in comparisons(rungs):
        shared = [seed for seed in seeds if (a, seed) in runs and (b, seed) in runs]
        entry: dict[str, Any] = {"a": a, "b": b, "seeds": shared, "measures": {}}
        for name in MEASURES:
            pairs = [(runs[a, seed].figures[name], runs[b, seed].figures[name]) for seed in shared]
            pairs = [pair for pair in pairs if not any(map(math.isnan, pair))]
            values_a, values_b = [x for x, _ in pairs], [y for _, y in pairs]
            entry["measures"][name] = (
                {"t_test": paired_t_test(values_a, values_b), "sign_flip": sign_flip_test(values_a, values_b)}
                if pairs
                else None
            )
        tests.append(entry)
    return {
        "plan": plan,
        "rungs": rungs,
        "seeds": seeds,
        "last_steps": LAST_STEPS,
        "rows": rows,
        "tests": tests,
        "missing": missing,
        "in_progress": [
            f"{rung} seed {seed} at step {run.steps[-1]['step']}" for (rung, seed), run in in_progress.items()
        ],
        "runs": runs,
        "in_progress_runs": in_progress,
    }


def report_ladder(out: Path, presets: list[str] | None = None, seeds: list[int] | None = None) -> Path:
    """write_ladder_outputs under OUT's lock: workers may be training beside it, each rewriting the table as
    it ends."""
    read_plan(out)  # no lock file in a folder that is not a ladder
    with output_lock(out, wait_seconds=SHARED_FILE_WAIT):
        return write_ladder_outputs(out, presets, seeds)


def write_ladder_outputs(out: Path, presets: list[str] | None = None, seeds: list[int] | None = None) -> Path:
    """(Re)build ladder.md, ladder.json, ladder.csv and ladder_dynamics.png from OUT; return ladder.md's
    path."""
    results = ladder_results(out, presets, seeds)
    runs, in_progress = results.pop("runs"), results.pop("in_progress_runs")
    (out / RESULTS_FILE).write_text(json.dumps(finite_or_null(results), indent=2) + "\n")
    with (out / CSV_FILE).open("w", newline="") as handle:
        writer = csv.writer(handle)
        names = [*MEASURES, "minutes"]
        writer.writerow(
            ["rung", "seeds", "heldout_before"] + [f"{n}_{s}" for n in names for s in ("mean", "std")]
        )
        for row in results["rows"]:
            writer.writerow(
                [row["rung"], len(row["seeds"]), row["before"]]
                + [row[n][s] for n in names for s in ("mean", "std")]
            )
    plot_ladder(runs, results["rungs"], out / PLOT_FILE, in_progress)
    table_path = out / TABLE_FILE
    table_path.write_text(ladder_markdown(results) + "\n")
    return table_path


def finite_or_null(value: Any) -> Any:
    """NaN and infinity (one seed, equal differences) as null, so ladder.json is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite_or_null(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite_or_null(v) for v in value]
    return value


def _number(value: float, measure: Measure, signed: bool = False) -> str:
    if math.isnan(value):
        return "-"
    value = 100 * value if measure.percent else value
    return f"{value:+.{measure.digits}f}" if signed else f"{value:.{measure.digits}f}"


def _mean_std(cell: dict, measure: Measure) -> str:
    if math.isnan(cell["std"]):
        return _number(cell["mean"], measure)
    return f"{_number(cell['mean'], measure)} ± {_number(cell['std'], measure)}"


def _p(value: float, digits: int = 3) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def ladder_markdown(results: dict[str, Any]) -> str:
    """The table (mean ± std across seeds), then the paired tests, then the plot."""
    plan, acc = results["plan"], MEASURES["heldout_acc"]
    seeds = results["seeds"]
    settings = ", ".join(f"{k}={v}" for k, v in plan["overrides"].items()) or "no overrides"
    scale = (
        f"scale preset {plan['scale']} under every rung"
        if plan.get("scale")
        else "the preset's scale otherwise: tiny-cpu for the embedded model"
    )
    lines = [
        f"Presets {', '.join(results['rungs'])}; seeds {', '.join(map(str, seeds))} (N = {len(seeds)}) "
        f"shared by every rung; {settings} ({scale}).",
        "",
        f"Mean ± sample std (N-1) across seeds. Held-out acc: avg@n on the held-out split after training; "
        f"the other figures are each run's mean over its last {results['last_steps']} steps (train samples, "
        f"before filtering for the zero-advantage share); a run whose last steps made no update has no "
        f"entropy or clip fraction and is left out of those. Minutes: training steps per run.",
        "",
        "| rung | seeds | held-out acc (%) before -> after | change (points) | "
        + " | ".join(MEASURES[name].label for name in list(MEASURES)[1:])
        + " | minutes per run |",
        "|---" * (len(MEASURES) + 4) + "|",
    ]
    for row in results["rows"]:
        before, after = row["before"], row["heldout_acc"]
        lines.append(
            f"| {row['rung']} | {len(row['seeds'])} | {_number(before, acc)} -> **{_mean_std(after, acc)}** "
            f"| {_number(after['mean'] - before, acc, signed=True)} | "
            + " | ".join(_mean_std(row[name], MEASURES[name]) for name in list(MEASURES)[1:])
            + f" | {row['minutes']['mean']:.1f} |"
        )
    if results["missing"]:
        lines += ["", f"Not finished (left out): {', '.join(results['missing'])}."]
    if results["in_progress"]:
        lines[-1] += f" In progress, dashed in the plot: {', '.join(results['in_progress'])}."
    smallest = min(1.0, 2 / 2 ** len(seeds))
    lines += [
        "",
        "### Paired tests across seeds (B against A, seed by seed)",
        "",
        f"For each seed, d = B - A; N = the seeds both finished. **Paired t-test**: t = mean d / (s_d / sqrt "
        f"N) on N-1 degrees of freedom, two-sided, with the 95 % interval of mean d (assumes normal "
        f"differences). **Exact sign-flip permutation test**: the share of the 2^N sign patterns of d whose "
        f"|mean| is at least the observed one (no normality assumed). With N = {len(seeds)} the sign-flip p "
        f"cannot go below {smallest:.3g}"
        + (", so it cannot reach 5 %" if smallest > 0.05 else "")
        + "; a difference is only called a finding when both tests agree.",
        "",
        "| B vs A | N | held-out acc B - A (points) | 95 % CI (t) | t | p (t-test) | p (sign-flip) |",
        "|---|---|---|---|---|---|---|",
    ]
    for test in results["tests"]:
        result = test["measures"]["heldout_acc"]
        if result is None:
            lines.append(f"| {test['b']} vs {test['a']} | 0 | - | - | - | - | - |")
            continue
        t, flip = result["t_test"], result["sign_flip"]
        low, high = t["ci95"]
        lines.append(
            f"| {test['b']} vs {test['a']} | {t['n']} | {_number(t['delta'], acc, signed=True)} | "
            f"{_number(low, acc, signed=True)} to {_number(high, acc, signed=True)} | {_p(t['t'], 2)} | "
            f"{_p(t['p_value'])} | {_p(flip['p_value'])} |"
        )
    others = list(MEASURES)[1:]
    lines += [
        "",
        "Other figures, B - A (p t-test / p sign-flip):",
        "",
        "| B vs A | " + " | ".join(MEASURES[name].label for name in others) + " |",
        "|---" * (len(others) + 1) + "|",
    ]
    for test in results["tests"]:
        cells = []
        for name in others:
            result = test["measures"][name]
            cells.append(
                "-"
                if result is None
                else f"{_number(result['t_test']['delta'], MEASURES[name], signed=True)} "
                f"({_p(result['t_test']['p_value'])} / {_p(result['sign_flip']['p_value'])})"
            )
        lines.append(f"| {test['b']} vs {test['a']} | " + " | ".join(cells) + " |")
    lines += ["", f"![per-step figures, mean across seeds with min-max band]({PLOT_FILE})"]
    return "\n".join(lines)


def plot_ladder(
    runs: dict[tuple[str, int], RunRecord],
    rungs: list[str],
    out: Path,
    in_progress: dict[tuple[str, int], RunRecord] | None = None,
) -> Path:
    """One panel per figure: per step, the mean across a rung's seeds as a line and the min-max as a band, one
    colour per rung. Held-out accuracy has points where it was measured (before, every `eval_every`, after).
    Unfinished runs (`in_progress`) are drawn one by one, dashed, in their rung's colour."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    in_progress = in_progress or {}
    seed_before = {
        run.seed: run.before for run in [*runs.values(), *in_progress.values()] if run.before is not None
    }

    def points(run: RunRecord, name: str) -> dict[int, float]:
        if name == "heldout_acc":
            measured = dict(run.heldout)
            if 0 not in measured and run.seed in seed_before:
                measured[0] = seed_before[run.seed]
            return measured
        return {r["step"]: v for r in run.steps if (v := STEP_SERIES[name](r)) is not None}

    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    colours = plt.get_cmap("tab10")
    for axis, (name, title) in zip(axes.flat, PANELS.items(), strict=True):
        for index, rung in enumerate(rungs):
            colour = colours(index % 10)
            series = [points(run, name) for (r, _), run in runs.items() if r == rung]
            if series:
                steps = sorted(set.intersection(*(set(p) for p in series)))
                values = [[p[step] for p in series] for step in steps]
                axis.plot(
                    steps,
                    [statistics.fmean(v) for v in values],
                    color=colour,
                    marker="o",
                    markersize=3,
                    label=f"{rung} ({len(series)} seeds)",
                )
                axis.fill_between(
                    steps, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2
                )
            for (r, seed), run in in_progress.items():
                if r == rung:
                    partial = sorted(points(run, name).items())
                    axis.plot(
                        [step for step, _ in partial],
                        [v for _, v in partial],
                        color=colour,
                        linestyle="--",
                        marker="o",
                        markersize=2,
                        label=f"{rung} seed {seed} (in progress)",
                    )
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.grid(alpha=0.3)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(labels), 6) or 1, fontsize=9)
    figure.suptitle(
        "Ladder: mean across seeds (line) and min-max (band)"
        + ("; dashed: runs in progress" if in_progress else "")
    )
    figure.tight_layout(rect=(0, 0.06, 1, 1))
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
