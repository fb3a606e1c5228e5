"""What each DAPO technique fixes, shown at small scale: full DAPO against DAPO without one technique, paired
by seed, on a setting where the problem it fixes can appear (the `effects-cpu` scale: generated word problems
the untrained model rarely gets right, a response limit that cuts its samples, 60 steps of 8 updates each).

Every technique has one pre-registered figure, the step it is read at and the direction DAPO's paper (arXiv
2503.14476) draws (`EFFECTS`; docs/results/effects/README.md holds the pre-registration with its reasons). A
technique is *shown* when the paired t-test over seeds gives p < 0.05 with the difference in the paper's
direction, and *not shown* otherwise (*pending* while fewer than 5 seeds have both runs finished); the exact
sign-flip test is reported beside it. Secondary figures are reported, never tested for the verdict.

    dapo-suite train effects --seeds 5 --out runs/effects

OUT is a ladder (`dapo_suite.train.ladder`: one run per arm and seed, resumable, several workers at once) with
the rungs `dapo` and the arms without each technique, so `ladder.md` and its plots come with it; this module
adds `effects.md`, `effects.json` and `effects.png`, rebuilt from the runs' metrics.jsonl alone.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dapo_suite.core.stats import paired_t_test, sign_flip_test
from dapo_suite.train.ladder import run_ladder
from dapo_suite.train.ladder_report import finite_or_null
from dapo_suite.train.run_folders import read_plan, run_finished, run_path
from dapo_suite.train.run_log import read_metrics

SCALE = "effects-cpu"
BASELINE = "dapo"
SIGNIFICANCE = 0.05
MIN_SEEDS = 5  # pre-registered: a verdict needs at least this many seeds both arms finished
TABLE_FILE, RESULTS_FILE, PLOT_FILE = "effects.md", "effects.json", "effects.png"

Records = list[dict]


def training_steps(records: Records) -> Records:
    return [r for r in records if "reward/acc" in r]


def metric(key: str) -> Callable[[dict], float | None]:
    """A record's value of one logged metric (None where it was not logged)."""
    return lambda record: record.get(key)


def trained_groups_with_signal(record: dict) -> float | None:
    """Groups a step trained on whose answers were both right and wrong (the only ones with a gradient): all
    the kept groups under dynamic sampling, the mixed ones among the sampled batch without it."""
    if "sampling/groups_kept" not in record:
        return None
    return min(record["sampling/groups_kept"], record["sampling/groups_mixed"])


def steps_mean(value: Callable[[dict], float | None], first: int, last: int) -> Callable[[Records], float]:
    """The mean of a per-step value over training steps first..last (inclusive)."""

    def measure(records: Records) -> float:
        values = [
            v for r in training_steps(records) if first <= r["step"] <= last and (v := value(r)) is not None
        ]
        return statistics.fmean(values) if values else math.nan

    return measure


def heldout_at(step: int, key: str) -> Callable[[Records], float]:
    """A held-out figure (`val/...`) measured at a step: an evaluation during training, or the one after
    it."""

    def measure(records: Records) -> float:
        return next((r[key] for r in records if r["step"] == step and key in r), math.nan)

    return measure


def accuracy_jitter(first: int, last: int) -> Callable[[Records], float]:
    """The sample std of the step-to-step change in train accuracy over steps first..last: how unsteady
    training is (what overlong filtering steadies, the paper's Figure 5)."""

    def measure(records: Records) -> float:
        accuracy = [r["reward/acc"] for r in training_steps(records) if first <= r["step"] <= last]
        changes = [b - a for a, b in zip(accuracy, accuracy[1:], strict=False)]
        return statistics.stdev(changes) if len(changes) > 1 else math.nan

    return measure


def minutes_to(step: int) -> Callable[[Records], float]:
    """Training minutes (steps only, evaluations excluded) until a step ends; NaN if the run did not reach
    it."""

    def measure(records: Records) -> float:
        steps = [r for r in training_steps(records) if r["step"] <= step]
        return sum(r.get("perf/step_seconds", 0.0) for r in steps) / 60 if len(steps) >= step else math.nan

    return measure


@dataclass(frozen=True)
class Figure:
    label: str
    measure: Callable[[Records], float]
    dapo_higher: bool  # the paper's direction: DAPO's value above the arm's
    series: Callable[[dict], float | None] | None = None  # the per-record value drawn for it in effects.png
    series_label: str = ""


@dataclass(frozen=True)
class Effect:
    arm: str  # the preset: DAPO without the technique
    paper: str  # where the paper shows the problem and the fix
    primary: Figure  # pre-registered: the verdict is its paired test
    secondary: tuple[Figure, ...]  # reported beside it


# figures several pre-registrations report after the last step
HELDOUT_PASS_AT_8 = Figure(
    "held-out pass@8 after step 60",
    heldout_at(60, "val/pass_at_8"),
    True,
    metric("val/pass_at_8"),
    "held-out pass@8",
)
HELDOUT_AVG_AT_8 = Figure("held-out avg@8 after step 60", heldout_at(60, "val/acc"), True)
# the same, drawn per step in effects.png (where it is a primary figure)
HELDOUT_AVG_AT_8_DRAWN = Figure(
    "held-out avg@8 after step 60", heldout_at(60, "val/acc"), True, metric("val/acc"), "held-out avg@8"
)
SAMPLED_ENTROPY_51_60 = Figure(
    "entropy of all sampled tokens, mean of steps 51-60 (nats/token)",
    steps_mean(metric("rollout/entropy"), 51, 60),
    True,
    metric("rollout/entropy"),
    "sampled entropy",
)

# The pre-registration: one primary figure a technique, read at the step named in its label (60 = the last
# step).
EFFECTS = {
    "clip-higher": Effect(
        "dapo-no-clip-higher",
        "Figure 2: entropy collapses under the symmetric clip",
        Figure(
            "entropy, mean of steps 51-60 (nats/token)",
            steps_mean(metric("actor/entropy"), 51, 60),
            True,
            metric("actor/entropy"),
            "entropy",
        ),
        (
            HELDOUT_PASS_AT_8,
            HELDOUT_AVG_AT_8,
        ),
    ),
    "dynamic sampling": Effect(
        "dapo-no-dynamic-sampling",
        "Figure 6: the same accuracy in fewer steps",
        Figure(
            "held-out avg@8 at step 20", heldout_at(20, "val/acc"), True, metric("val/acc"), "held-out avg@8"
        ),
        (
            Figure("minutes of training to step 20", minutes_to(20), False),
            HELDOUT_AVG_AT_8,
            Figure(
                "trained groups with a gradient per step, mean of steps 1-20",
                steps_mean(trained_groups_with_signal, 1, 20),
                True,
                trained_groups_with_signal,
                "trained groups with a gradient",
            ),
        ),
    ),
    "token-level loss": Effect(
        "dapo-sample-loss",
        "Figure 4: length and entropy grow unhealthily under the sample-level loss",
        Figure(
            "response length, mean of steps 51-60 (tokens)",
            steps_mean(metric("response_len/mean"), 51, 60),
            False,
            metric("response_len/mean"),
            "response length",
        ),
        (
            Figure(
                "entropy, mean of steps 51-60 (nats/token)",
                steps_mean(metric("actor/entropy"), 51, 60),
                False,
                metric("actor/entropy"),
                "entropy",
            ),
        ),
    ),
    "overlong handling": Effect(
        "dapo-no-overlong",
        "Figure 5: training is steadier with truncated samples masked",
        Figure(
            "std of the step-to-step change in train accuracy, steps 11-60",
            accuracy_jitter(11, 60),
            False,
            metric("reward/acc"),
            "train accuracy",
        ),
        (
            Figure(
                "truncated samples, mean of steps 51-60",
                steps_mean(metric("response_len/clip_ratio"), 51, 60),
                True,
                metric("response_len/clip_ratio"),
                "truncated share",
            ),
            HELDOUT_AVG_AT_8,
        ),
    ),
}


def change(
    value: Callable[[dict], float | None], early: tuple[int, int], late: tuple[int, int]
) -> Callable[[Records], float]:
    """The mean of a per-step value over the `late` steps minus its mean over the `early` steps: how training
    moved it (NaN where it was not logged, e.g. tool use in a text-only run)."""
    first, last = steps_mean(value, *early), steps_mean(value, *late)
    return lambda records: last(records) - first(records)


# The tool study's pre-registration (docs/results/tools/README.md): DAPO with the Python tool against DAPO on
# text alone, same task, same prompt but for the tool's instructions and example.
TOOL_EFFECTS = {
    "Python tool": Effect(
        "dapo",
        "ReTool (arXiv 2504.11536): 67 % vs 40 % on AIME 2024, and RL raises tool use",
        HELDOUT_AVG_AT_8_DRAWN,
        (
            HELDOUT_PASS_AT_8,
            Figure("held-out avg@8 before training", heldout_at(0, "val/acc"), True),
            Figure(
                "held-out avg@8, after step 60 minus before training",
                lambda records: heldout_at(60, "val/acc")(records) - heldout_at(0, "val/acc")(records),
                True,
            ),
            Figure(
                "responses that call the tool, mean of steps 51-60 minus steps 1-10 (tool arm)",
                change(metric("tool/call_rate"), (1, 10), (51, 60)),
                True,
                metric("tool/call_rate"),
                "responses calling the tool",
            ),
            Figure(
                "calls whose code fails, mean of steps 51-60 (tool arm)",
                steps_mean(metric("tool/error_rate"), 51, 60),
                False,
                metric("tool/error_rate"),
                "calls whose code fails",
            ),
        ),
    ),
}


# Clip-Higher's second setting (docs/results/clip-higher-16/README.md): the paper's 16 updates a rollout
# batch, the entropy of every sampled token.
CLIP_HIGHER_16 = {
    "clip-higher": Effect(
        "dapo-no-clip-higher",
        "Figure 2: entropy collapses under the symmetric clip",
        SAMPLED_ENTROPY_51_60,
        (
            HELDOUT_PASS_AT_8,
            HELDOUT_AVG_AT_8,
            Figure(
                "tokens at the upper clip, mean of steps 1-10",
                steps_mean(metric("actor/clipfrac_upper"), 1, 10),
                False,
                metric("actor/clipfrac_upper"),
                "tokens at the upper clip",
            ),
            Figure(
                "tokens at the upper clip, mean of steps 51-60",
                steps_mean(metric("actor/clipfrac_upper"), 51, 60),
                False,
            ),
            Figure(
                "entropy of the trained tokens, mean of steps 51-60 (nats/token)",
                steps_mean(metric("actor/entropy"), 51, 60),
                True,
            ),
        ),
    ),
}


# The int8-rollouts study (docs/results/int8-rollouts/README.md): full DAPO sampling from an int8 copy of the
# weights against full precision. The primary figure's "shown" is harm: full precision above int8.
INT8_ROLLOUTS = {
    "int8 rollouts": Effect(
        "dapo-int8-rollouts",
        "FlashRL (2025): int8 rollouts with truncated importance sampling keep the BF16 run's accuracy",
        HELDOUT_AVG_AT_8_DRAWN,
        (
            HELDOUT_PASS_AT_8,
            SAMPLED_ENTROPY_51_60,
            Figure(
                "k3 KL of the sampler from the policy, mean of steps 1-60 (int8 arm)",
                steps_mean(metric("rollout_corr/k3_kl"), 1, 60),
                False,
                metric("rollout_corr/k3_kl"),
                "rollout-policy k3 KL",
            ),
            Figure(
                "training minutes per run (sum of perf/step_seconds)",
                minutes_to(60),
                True,
            ),
        ),
    ),
}


@dataclass(frozen=True)
class Study:
    """A pre-registered comparison: `baseline` against each effect's arm, paired by seed, at the `scale`
    preset with `overrides` (TrainConfig fields) on every run. The labels name the two sides in its tables
    ("DAPO" / "without it")."""

    name: str
    scale: str
    baseline: str
    effects: dict[str, Effect]
    baseline_label: str = "DAPO"
    arm_label: str = "without it"
    overrides: dict = field(default_factory=dict)
    comparison: str = "DAPO against DAPO without each technique"  # the tables' opening line

    @property
    def arms(self) -> tuple[str, ...]:
        return (self.baseline, *(effect.arm for effect in self.effects.values()))


STUDIES = {
    study.name: study
    for study in (
        Study("dapo-effects", SCALE, BASELINE, EFFECTS),
        Study(
            "tool",
            "tools-cpu",
            "dapo-tool",
            TOOL_EFFECTS,
            "with the tool",
            "text only",
            comparison="DAPO with the Python tool against DAPO on text alone",
        ),
        Study(
            "clip-higher-16",
            SCALE,
            BASELINE,
            CLIP_HIGHER_16,
            overrides={"ppo_epochs": 4},
            comparison="DAPO against DAPO without Clip-Higher, 16 updates a rollout batch",
        ),
        Study(
            "int8-rollouts",
            SCALE,
            BASELINE,
            INT8_ROLLOUTS,
            "full precision",
            "int8 rollouts",
            comparison="DAPO sampling from full-precision weights against DAPO sampling from int8 weights",
        ),
    )
}
ARMS = STUDIES["dapo-effects"].arms


def study_of(out: Path) -> Study:
    """The study a folder holds, from its plan's scale preset and overrides."""
    plan = read_plan(out)
    for study in STUDIES.values():
        if study.scale == plan.get("scale") and study.overrides == plan.get("overrides", {}):
            return study
    raise ValueError(
        f"{out}: its plan (scale {plan.get('scale')!r}, overrides {plan.get('overrides')}) is no "
        f"study's ({', '.join(STUDIES)})"
    )


def run_effects(
    out: Path,
    arms: list[str],
    seeds: list[int],
    keep_checkpoints: bool = False,
    study: Study = STUDIES["dapo-effects"],
) -> Path:
    """Train every (arm, seed) not yet finished (the ladder's runner: resumable, one worker per run), then
    write the effects table; return its path."""
    run_ladder(out, arms, seeds, study.overrides, scale=study.scale, keep_checkpoints=keep_checkpoints)
    return write_effects_outputs(out)


def effects_results(out: Path) -> dict:
    """Per technique: each figure per seed for the baseline (DAPO) and the arm, the paired tests over the
    seeds both finished, and the verdict on the primary figure."""
    study = study_of(out)
    seeds = read_plan(out)["seeds"]
    records = {
        (arm, seed): metrics_from_step_zero(path)
        for arm in study.arms
        for seed in seeds
        if run_finished(path := run_path(out, arm, seed))
    }
    results = {}
    for technique, effect in study.effects.items():
        shared = [
            seed for seed in seeds if (study.baseline, seed) in records and (effect.arm, seed) in records
        ]
        figures = []
        for figure in (effect.primary, *effect.secondary):
            dapo = [figure.measure(records[study.baseline, seed]) for seed in shared]
            arm = [figure.measure(records[effect.arm, seed]) for seed in shared]
            pairs = [(a, d) for a, d in zip(arm, dapo, strict=True) if not (math.isnan(a) or math.isnan(d))]
            t_test = paired_t_test([a for a, _ in pairs], [d for _, d in pairs]) if pairs else None
            flip = sign_flip_test([a for a, _ in pairs], [d for _, d in pairs]) if pairs else None
            figures.append(
                {
                    "label": figure.label,
                    "dapo_higher_expected": figure.dapo_higher,
                    "dapo": dapo,
                    "arm": arm,
                    "t_test": t_test,
                    "sign_flip": flip,
                }
            )
        primary = figures[0]
        expected = 1 if effect.primary.dapo_higher else -1
        shown = (
            primary["t_test"] is not None
            and len(shared) >= 2
            and primary["t_test"]["p_value"] < SIGNIFICANCE
            and math.copysign(1, primary["t_test"]["delta"]) == expected
        )
        verdict = (
            ("shown" if shown else "not shown")
            if len(shared) >= MIN_SEEDS
            else f"pending: {len(shared)} of {MIN_SEEDS} seeds"
        )
        results[technique] = {
            "arm": effect.arm,
            "paper": effect.paper,
            "seeds": shared,
            "figures": figures,
            "verdict": verdict,
        }
    missing = [f"{arm} seed {seed}" for arm in study.arms for seed in seeds if (arm, seed) not in records]
    return {"study": study.name, "seeds": seeds, "techniques": results, "missing": missing}


def write_effects_outputs(out: Path) -> Path:
    """effects.json, effects.md and effects.png from OUT; the path of effects.md."""
    results = effects_results(out)
    (out / RESULTS_FILE).write_text(json.dumps(finite_or_null(results), indent=2) + "\n")
    plot_effects(out, results["seeds"], STUDIES[results["study"]])
    table = out / TABLE_FILE
    table.write_text(effects_markdown(results) + "\n")
    return table


def _cell(values: list[float]) -> str:
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "-"
    return f"{statistics.median(finite):.3g} ({min(finite):.3g} to {max(finite):.3g})"


def effects_markdown(results: dict) -> str:
    """One row per technique (the pre-registered figure and verdict), then every figure per seed."""
    study = STUDIES[results.get("study", "dapo-effects")]
    ours, theirs = study.baseline_label, study.arm_label
    lines = [
        f"Seeds {', '.join(map(str, results['seeds']))}; {study.comparison}, paired by seed. Shown: paired "
        f"t-test p < {SIGNIFICANCE} with the difference in the paper's direction; the exact sign-flip p is "
        f"beside it (with 5 seeds it cannot go below 0.0625).",
        "",
        f"| technique | pre-registered figure | {ours}, median (range) | {theirs} | {ours} - {theirs} (mean) "
        f"| p (t-test / sign-flip) | seeds | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for technique, result in results["techniques"].items():
        lines.append(
            _row(
                technique,
                result["figures"][0],
                result,
                bold=True,
                higher=f"{ours} higher",
                lower=f"{ours} lower",
            )
        )
    lines += [
        "",
        "Secondary figures (reported, not tested for the verdict):",
        "",
        f"| technique | figure | {ours}, median (range) | {theirs} | {ours} - {theirs} (mean) | "
        "p (t-test / sign-flip) | seeds | expected |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for technique, result in results["techniques"].items():
        for figure in result["figures"][1:]:
            lines.append(
                _row(technique, figure, result, bold=False, higher=f"{ours} higher", lower=f"{ours} lower")
            )
    lines += ["", f"Per seed ({ours} / {theirs}):", ""]
    for technique, result in results["techniques"].items():
        for figure in result["figures"]:
            pairs = ", ".join(
                f"{seed}: {d:.3g} / {a:.3g}"
                for seed, d, a in zip(result["seeds"], figure["dapo"], figure["arm"], strict=True)
            )
            lines.append(f"- {technique}, {figure['label']}: {pairs or 'no seed finished both'}")
    if results["missing"]:
        lines += ["", f"Not finished: {', '.join(results['missing'])}."]
    lines += ["", f"![each technique's figures per step, median and min-max band over seeds]({PLOT_FILE})"]
    return "\n".join(lines)


def _row(
    technique: str,
    figure: dict,
    result: dict,
    bold: bool,
    higher: str = "DAPO higher",
    lower: str = "DAPO lower",
) -> str:
    t_test, flip = figure["t_test"], figure["sign_flip"]
    delta = "-" if t_test is None else f"{t_test['delta']:+.3g}"
    p = "-" if t_test is None else f"{t_test['p_value']:.3g} / {flip['p_value']:.3g}"
    direction = higher if figure["dapo_higher_expected"] else lower
    last = f"**{result['verdict']}** ({direction} expected)" if bold else direction
    return (
        f"| {technique} | {figure['label']} | {_cell(figure['dapo'])} | {_cell(figure['arm'])} | {delta} | "
        f"{p} | {len(result['seeds'])} | {last} |"
    )


def metrics_from_step_zero(run_dir: Path) -> Records:
    """A run's metrics with its held-out evaluation before training as step 0, as the trainer logs it: a run
    whose seed's evaluation another run made (the ladder shares it) holds it only in its summary.json."""
    records = read_metrics(run_dir)
    summary = run_dir / "summary.json"
    before = json.loads(summary.read_text()).get("before") if summary.is_file() else None
    if before is None or any(record.get("step") == 0 for record in records):
        return records
    return [{"step": 0, **{f"val/{key}": value for key, value in before.items()}}, *records]


def plot_effects(out: Path, seeds: list[int], study: Study = STUDIES["dapo-effects"]) -> Path:
    """One panel per drawn figure: DAPO and the arm per step, the median over seeds as a line, min-max as a
    band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (technique, effect, figure)
        for technique, effect in study.effects.items()
        for figure in (effect.primary, *effect.secondary)
        if figure.series
    ]
    # every run that has metrics (unfinished ones too, unlike the tables), read once for all the panels
    records = {
        (arm, seed): metrics_from_step_zero(path)
        for arm in study.arms
        for seed in seeds
        if (path := run_path(out, arm, seed)).joinpath("metrics.jsonl").is_file()
    }
    columns = 3
    rows = math.ceil(len(panels) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5 * columns, 3.6 * rows), squeeze=False)
    for axis, (technique, effect, figure) in zip(axes.flat, panels, strict=False):
        for arm, colour in ((study.baseline, "tab:blue"), (effect.arm, "tab:orange")):
            per_seed = [
                {r["step"]: v for r in records[arm, seed] if (v := figure.series(r)) is not None}
                for seed in seeds
                if (arm, seed) in records
            ]
            steps = sorted(set().union(*per_seed)) if per_seed else []
            values = [[p[s] for p in per_seed if s in p] for s in steps]
            if steps:
                axis.plot(
                    steps,
                    [statistics.median(v) for v in values],
                    color=colour,
                    marker=".",
                    label=f"{arm} ({len(per_seed)} seeds)",
                )
                axis.fill_between(
                    steps, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.2
                )
        axis.set_title(f"{technique}: {figure.series_label}", fontsize=10)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    for axis in list(axes.flat)[len(panels) :]:
        axis.axis("off")
    fig.tight_layout()
    path = out / PLOT_FILE
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
