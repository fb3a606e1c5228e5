"""`dapo-suite demo` (what `make demo` runs): the whole chain on the embedded default, on a CPU.

  1. data   `dapo-suite data build` on the shipped raw arithmetic problems: dedup, decontaminate against the
            evaluation sets, rewrite fraction and decimal answers to integers, verify, export parquet
  2. eval   AIME 2024 with the starting model (small n and token budget: a 135M model scores ~0 either way;
            the point is the protocol end to end)
  3. train  DAPO (`dapo` preset at `tiny-cpu` scale) on the built parquet, held-out accuracy before and after
  4. eval   AIME 2024 again with the trained checkpoint
  5. report report.md / report.html with the plots, the evaluation table, data statistics, commands, versions

Every stage resumes: a rerun of the same command continues where the last one stopped. With `--tools python`
the model may run Python in the sandbox between its turns, in training (the `dapo-tool` preset at the tiny-cpu
scale) and in both evaluations (docs/tools.md).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import click

from dapo_suite.core.lock import output_lock
from dapo_suite.train.report import CHAIN_FILE, package_versions, write_report

# The demo's promise (docs/results/demo/): held-out accuracy after training at least 50 % and 30 points above
# the start. The early signal is its cheap proxy, read from the training steps alone: over steps 5-6 the train
# samples are right and end in an `Answer:` line often enough (thresholds set below every committed run of the
# default, and above the untrained model: docs/results/demo/, "The guard's proxy").
DEMO_TARGET_ACC, DEMO_TARGET_RISE = 0.50, 0.30
EARLY_STEPS = 6
EARLY_MIN_TRAIN_ACC, EARLY_MIN_FORMAT_RATE = 0.25, 0.70


def meets_demo_target(before: float, after: float) -> bool:
    """Held-out accuracy (fractions) before and after training reach the demo's target."""
    return after >= DEMO_TARGET_ACC and after - before >= DEMO_TARGET_RISE


def early_signal(train_acc: list[float], format_rate: list[float]) -> bool:
    """The proxy for the target: the mean train accuracy and answer-format rate of the last two of the first
    EARLY_STEPS steps (one value per step, step 1 first) reach their thresholds."""
    if len(train_acc) < EARLY_STEPS or len(format_rate) < EARLY_STEPS:
        return False
    last_two = slice(EARLY_STEPS - 2, EARLY_STEPS)
    return (
        sum(train_acc[last_two]) / 2 >= EARLY_MIN_TRAIN_ACC
        and sum(format_rate[last_two]) / 2 >= EARLY_MIN_FORMAT_RATE
    )


# The training fields each demo precision sets (`auto`: the preset's own, bf16 where native).
DEMO_DTYPES = {
    "auto": {},
    "float32": {"sampling_dtype": None, "autocast_dtype": None},
    "bfloat16": {"sampling_dtype": "bfloat16", "autocast_dtype": "bfloat16"},
}


@dataclass
class DemoConfig:
    out: str = "runs/demo"
    source: str = "arithmetic"  # a `dapo-suite data build --input` value; `arithmetic` ships with the package
    preset: str = "dapo"
    max_steps: int | None = None  # default: the tiny-cpu preset's
    seed: int = 0  # the training run's seed
    train_overrides: dict = field(default_factory=dict)  # TrainConfig fields (`--set key=value`)
    aime_n: int = 2  # samples per AIME problem (the paper: 32)
    aime_max_tokens: int = 256  # per AIME sample (the paper: 20480)
    aime_limit: int | None = None  # first N AIME problems (default all 30)
    # one precision for every stage: "auto" (bf16 where the CPU has it natively), or float32 / bfloat16
    # everywhere, e.g. float32 to run as a CPU without native bf16 does
    dtype: str = "auto"
    tools: str | None = None  # "python": multi-turn with the sandbox in training and evaluation

    def __post_init__(self) -> None:
        if self.dtype not in DEMO_DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: choose one of {', '.join(DEMO_DTYPES)}.")
        if self.tools not in (None, "python"):
            raise ValueError(f"tools={self.tools!r}: the tools are python.")

    @property
    def presets(self) -> list[str]:
        """The training presets: `preset`, or with the tool the `dapo-tool` preset at the demo's tiny-cpu
        scale."""
        return ["tiny-cpu", "dapo-tool"] if self.tools else [self.preset]


class Chain:
    """Runs stages in order, timing each and recording the command that does the same by hand in
    chain.json."""

    def __init__(self, out: Path, config: DemoConfig) -> None:
        self.path = out / CHAIN_FILE
        saved = json.loads(self.path.read_text()) if self.path.is_file() else {}
        self.stages = {stage["name"]: stage for stage in saved.get("stages", [])}
        self.record = {"config": asdict(config), "versions": package_versions(), "stages": []}

    def run(self, name: str, command: str, action) -> None:
        click.echo(f"\n== {name}: {command}")
        # A resumed stage adds to the time it had already spent; while it runs, its time is not yet known.
        previous = self.stages.get(name, {}).get("seconds") or 0.0
        self._save(name, command, None)
        start = time.monotonic()
        action()
        self._save(name, command, previous + time.monotonic() - start)

    def _save(self, name: str, command: str, seconds: float | None) -> None:
        self.stages[name] = {"name": name, "command": command, "seconds": seconds}
        self.record["stages"] = list(self.stages.values())
        self.path.write_text(json.dumps(self.record, indent=2))


def run_demo(config: DemoConfig) -> Path:
    """The chain into config.out, which it holds alone (a second demo into the same folder is refused)."""
    with output_lock(config.out) as out:
        return _run_chain(config, out)


def _run_chain(config: DemoConfig, out: Path) -> Path:
    from dapo_suite.train.config import resolve_config
    from dapo_suite.train.trainer import DAPOTrainer
    from data_pipeline.build import run_build
    from data_pipeline.config import BuildConfig
    from eval.config import EvalConfig
    from eval.runner import run_eval

    chain = Chain(out, config)
    data_dir, train_dir = out / "data", out / "train"
    checkpoint = train_dir / "checkpoint-last"

    chain.run(
        "data",
        f"dapo-suite data build --input {config.source} --out {data_dir}",
        lambda: run_build(BuildConfig(inputs=[config.source], out=str(data_dir)), log=click.echo),
    )

    def aime(model: str | None, name: str) -> None:
        eval_config = EvalConfig(
            benchmark="aime24",
            model=model,
            n=config.aime_n,
            max_tokens=config.aime_max_tokens,
            limit=config.aime_limit,
            dtype=config.dtype,
            out=str(out / "eval" / name),
            tools=config.tools,
        )
        results = run_eval(eval_config)
        click.echo(f"AIME 2024 avg@{config.aime_n}: {100 * results['avg@k']:.1f} %")

    aime_flags = f"--n {config.aime_n} --max-tokens {config.aime_max_tokens}"
    aime_flags += f" --limit {config.aime_limit}" if config.aime_limit else ""
    aime_flags += f" --dtype {config.dtype}" if config.dtype != "auto" else ""
    aime_flags += f" --tools {config.tools}" if config.tools else ""
    chain.run(
        "eval before",
        f"dapo-suite eval aime24 {aime_flags} --out {out / 'eval/aime24-before'}",
        lambda: aime(None, "aime24-before"),
    )

    train_settings = {**DEMO_DTYPES[config.dtype], **config.train_overrides}
    train_config = resolve_config(
        config.presets,
        {
            "max_steps": config.max_steps,
            "seed": config.seed,
            "train_file": str(data_dir / "train.parquet"),
            "out": str(train_dir),
        },
        train_settings,
    )
    train_flags = f" --max-steps {config.max_steps}" if config.max_steps else ""
    train_flags += f" --seed {config.seed}" if config.seed else ""
    train_flags += "".join(
        f" --set {key}={'null' if value is None else value}" for key, value in train_settings.items()
    )

    def train() -> None:
        resume = (train_dir / "metrics.jsonl").is_file()
        click.echo(
            f"{train_config.max_steps} steps, {train_config.train_batch_size} prompts x "
            f"{train_config.group_size} responses each" + (" (resuming)" if resume else "")
        )
        summary = DAPOTrainer(train_config, resume=resume).fit()
        before, after = summary["before"], summary["after"]
        click.echo(
            f"held-out accuracy (avg@{train_config.val_n}, {before['problems']} problems): "
            f"{100 * before['acc']:.1f} % -> {100 * after['acc']:.1f} %"
        )
        click.echo(summary["verdict"]["text"])

    preset_flags = " ".join(f"--preset {name}" for name in config.presets)
    chain.run(
        "train",
        f"dapo-suite train {preset_flags} --train-file {data_dir / 'train.parquet'} "
        f"--out {train_dir}{train_flags}",
        train,
    )
    chain.run(
        "eval after",
        f"dapo-suite eval aime24 --model {checkpoint} {aime_flags} --out {out / 'eval/aime24-after'}",
        lambda: aime(str(checkpoint), "aime24-after"),
    )
    chain.run("report", f"dapo-suite report {out}", lambda: write_report(out))
    return out
