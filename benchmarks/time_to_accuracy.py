"""Time to accuracy: dapo-suite's `dapo` preset against TRL's GRPOTrainer configured for DAPO, end to end.

What a user who would otherwise train with TRL gets: held-out accuracy over training wall time (sampling,
reward and updates; evaluation excluded), on the built-in arithmetic task with the embedded
SmolLM2-135M-Instruct. Runs in the environment with TRL (it breaks verl's model building: pyproject.toml, the
`bench` extra):

    bash scripts/bootstrap.sh .venv-bench && .venv-bench/bin/pip install -e '.[bench]'
    .venv-bench/bin/python -m benchmarks.time_to_accuracy                   # 5 seeds a side, 1 thread, pinned
    .venv-bench/bin/python -m benchmarks.time_to_accuracy --seeds 1 --steps 4 --budget-minutes 3 --out
    /tmp/tta .venv-bench/bin/python -m benchmarks.time_to_accuracy --summary-only     # tables and plot from
    --results

Both sides take their settings from one resolved `dapo` config at `tiny-cpu` scale: the same model, training
and held-out problems (the task's split for the seed), G = 16 responses of at most 64 tokens, 4 prompts
trained per rollout batch in 2 optimiser updates of 2 prompts (micro-batches of 16), lr 3e-5 after the same
warm-up, weight decay 0.1, grad clip 1.0, T 1.0, top_p 1.0, eps 0.2 / 0.28, dual-clip c = 10, the project's
correctness score (+1 right, -1 otherwise) as the reward, bf16 where the CPU has it natively (ours
`autocast_dtype`/`sampling_dtype` auto, TRL `bf16=True`), float32 weights and AdamW state. Ours adds the soft
overlong penalty (eq. 13) as the preset does; TRL gets the correctness score alone (`--trl-reward dapo` adds
TRL's own `get_soft_overlong_punishment`: without dynamic sampling, the penalty is the only signal in groups
that are all wrong, and the one seed run so learned to answer short and wrong:
docs/results/time-to-accuracy/README.md).

- ours: `dapo-suite train --preset dapo` as a user runs it (dynamic sampling: up to 2 generation batches of 8
  prompts to find 4 with mixed outcomes; truncated responses filtered). Training time = the sum of its steps'
  `perf/step_seconds` (sampling, reward, update; evaluation and checkpoints excluded).
- ours with TRL's settings (`ours-trl-settings`): the same command with one generation batch of the 4 trained
  prompts, no dynamic sampling and no soft overlong penalty (`trl_settings`), so it differs from TRL in the
  trainer and sampler only, and from `ours` in DAPO's sampling and reward only.
- TRL:
  `GRPOTrainer(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, delta=10, mask_truncated_completions=True,
  beta=0)`, per_device_train_batch_size 16, gradient_accumulation_steps 2, steps_per_generation 4 (one
  generation batch of 4 prompts x 16 = 2 optimiser updates, as ours), its own `generate` sampling, no gradient
  checkpointing. No dynamic sampling (TRL has none): groups that are all right or all wrong train with zero
  advantage. Training time = wall time from the first step on, minus the evaluations.

Held-out accuracy: both sides measured by the same code (`heldout_accuracy`: the project's sampler on the
model's current weights, avg@2 over the 100 held-out problems, T 1.0, top_p 0.7, seeded by the run's seed)
before training and every `--eval-every` rollout batches; the two sides' step-0 figures must agree (same
weights, same seed). Each run is a process of its own with `--threads` threads; sides alternate by seed. A
side's run that is interrupted is started again (ours resumes from its last checkpoint). Each side stops at
its first evaluation at or above `--target`: TRL after `--budget-minutes` of training time at most, ours after
`--steps` rollout batches.

Prints the CPU's flags and load with each run, then per seed the training time to first reach `--target`
held-out accuracy, the accuracy each side has when the fastest run ends, and for each dapo-suite arm against
TRL the per-seed ratios, their median and the ratio of mean times (target: ours >= 3x sooner). `--sides` picks
arms. Writes curves.jsonl (every evaluation of every run), summary.json, summary.txt and time_to_accuracy.png
into `--results`; `--summary-only` rebuilds those from curves.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import yaml

from dapo_suite.core.provenance import cpu_description, cpu_line
from dapo_suite.train.checkpoint import remove_checkpoints
from dapo_suite.train.config import TrainConfig, resolve_config

SIDES = ("ours", "ours-trl-settings", "trl")
REACHED = "reached"  # in an ours run directory: stopped at --target
LABELS = {
    "ours": "dapo-suite (dapo preset)",
    "ours-trl-settings": "dapo-suite with TRL's settings (no dynamic sampling, no overlong penalty)",
    "trl": "TRL GRPOTrainer (loss_type=dapo)",
}
SHORT = {"ours": "ours", "ours-trl-settings": "ours as TRL", "trl": "TRL"}


def shared_config(seed: int, out: str, eval_every: int, heldout_size: int | None = None) -> TrainConfig:
    """The one `dapo` config both sides read their settings from (tiny-cpu scale, the embedded model);
    `heldout_size` replaces the preset's held-out problem count (a quick check's)."""
    return resolve_config(
        ["dapo"],
        {
            "seed": seed,
            "out": out,
            "eval_every": eval_every,
            "device": "cpu",
            **({"heldout_size": heldout_size} if heldout_size else {}),
        },
    )


# ---- the runs
# --------------------------------------------------------------------------------------------------


def run_ours(args, seed: int, run_dir: Path, settings: tuple[str, ...] = ()) -> None:
    """`dapo-suite train --preset dapo` in a process of its own, stopped at its first held-out evaluation at
    or above `--target` (as TRL's run is; REACHED marks it); resumes a run an earlier call left unfinished."""
    resume = ["--resume"] if any(run_dir.glob("checkpoint-*")) else []
    command = [
        str(Path(sys.executable).parent / "dapo-suite"),
        "train",
        "--preset",
        "dapo",
        "--out",
        str(run_dir),
        "--max-steps",
        str(args.steps),
        "--set",
        f"seed={seed}",
        "--set",
        f"eval_every={args.eval_every}",
        "--set",
        f"save_every={args.eval_every}",
        "--set",
        "keep_checkpoints=1",
        *settings,
        *resume,
        *(["--set", f"heldout_size={args.heldout_size}"] if args.heldout_size else []),
    ]
    process = subprocess.Popen(command, env=thread_env(args.threads))
    while process.poll() is None:
        time.sleep(2.0)
        if (run_dir / "metrics.jsonl").is_file() and any(
            point["batches"] > 0 and point["acc"] >= args.target for point in ours_curve(run_dir)
        ):
            process.terminate()
            process.wait()
            (run_dir / REACHED).write_text("")
            return
    if process.returncode:
        raise subprocess.CalledProcessError(process.returncode, command)


def trl_settings(config: TrainConfig) -> tuple[str, ...]:
    """What makes dapo-suite sample and reward as TRL does: one generation batch of the trained prompts, every
    group trains (no dynamic sampling), correctness alone (no soft overlong penalty); truncated responses stay
    masked (TRL's mask_truncated_completions). The trainer and sampler are dapo-suite's: the arm isolates
    them."""
    values = {
        "dynamic_sampling": "false",
        "overlong_penalty": "false",
        "max_num_gen_batches": 1,
        "gen_batch_size": config.train_batch_size,
    }
    return tuple(flag for key, value in values.items() for flag in ("--set", f"{key}={value}"))


def run_trl(args, seed: int, run_dir: Path) -> None:
    """This file with `--side trl` in a process of its own; an unfinished TRL run starts over."""
    shutil.rmtree(run_dir, ignore_errors=True)
    command = [
        sys.executable,
        __file__,
        "--side",
        "trl",
        "--seed",
        str(seed),
        "--run-dir",
        str(run_dir),
        "--eval-every",
        str(args.eval_every),
        "--target",
        str(args.target),
        "--budget-minutes",
        str(args.budget_minutes),
        "--threads",
        str(args.threads),
        "--trl-reward",
        args.trl_reward,
        *(["--heldout-size", str(args.heldout_size)] if args.heldout_size else []),
    ]
    subprocess.run(command, check=True, env=thread_env(args.threads))


def thread_env(threads: int) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "false"}


def ours_curve(run_dir: Path) -> list[dict]:
    """(rollout batches, training seconds, held-out accuracy, the CPU) at each evaluation, from the run's
    metrics.jsonl and config.yaml. A resumed run logs the steps after its checkpoint again: the last record of
    a step counts."""
    machine = yaml.safe_load((run_dir / "config.yaml").read_text()).get("machine")
    step_seconds: dict[int, float] = {}
    evaluations: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if "perf/step_seconds" in record:
            step_seconds[record["step"]] = record["perf/step_seconds"]
        if "val/acc" in record:
            evaluations[record["step"]] = record
    curve = []
    for step, record in sorted(evaluations.items()):
        seconds = sum(value for index, value in step_seconds.items() if index <= step)
        curve.append(
            {
                "batches": step,
                "seconds": seconds,
                "acc": record["val/acc"],
                "acc_stderr": record["val/acc_stderr"],
                "machine": machine,
            }
        )
    return curve


def heldout_now(engine, prompts: list[str], answers: list[str], config: TrainConfig) -> dict[str, float]:
    """Held-out accuracy of the model's weights as they are now, measured as the trainer measures it
    (`heldout_accuracy_of`). TRL's optimiser changes the weights in place and never tells the engine, whose
    sampler keeps a snapshot of them until `sync_weights`: without it every evaluation measured the starting
    model."""
    from dapo_suite.train.evaluate import heldout_accuracy_of

    engine.sync_weights()
    return heldout_accuracy_of(engine, prompts, answers, config)


def train_trl(args) -> None:
    """The TRL side (runs in the child process): GRPOTrainer on the shared config, evaluated by a callback."""
    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl.rewards import get_soft_overlong_punishment

    from dapo_suite.core.prompts import chat_messages, render_chat
    from dapo_suite.core.reward import compute_score
    from dapo_suite.inference.models import load_model_and_tokenizer, resolve_precision
    from dapo_suite.train.rollout import hf_engine
    from dapo_suite.train.tasks import train_and_heldout

    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = shared_config(args.seed, str(run_dir), args.eval_every, args.heldout_size)
    precision = resolve_precision(config.autocast_dtype)
    config_for_eval = replace(config, sampling_dtype=resolve_precision(config.sampling_dtype))
    train, heldout = train_and_heldout(config)
    model, tokenizer = load_model_and_tokenizer(None, dtype="float32", device="cpu")
    text = [
        render_chat(tokenizer, chat_messages(problem.problem, shots=config.prompt_shots)) for problem in train
    ]
    dataset = Dataset.from_dict({"prompt": text, "answer": [problem.answer for problem in train]})
    heldout_prompts = [
        render_chat(tokenizer, chat_messages(problem.problem, shots=config.prompt_shots))
        for problem in heldout
    ]
    engine = hf_engine(config_for_eval, model, tokenizer)

    def correctness(completions, answer, **kwargs) -> list[float]:
        """The project's correctness score (+1 right, -1 otherwise), as `DAPOTrainer.score` gives it."""
        return [
            compute_score("dapo-suite", completion, truth)["score"]
            for completion, truth in zip(completions, answer, strict=True)
        ]

    reward_funcs = [correctness]
    if args.trl_reward == "dapo":  # + eq. 13 as TRL ships it, summed with the correctness score
        reward_funcs.append(
            get_soft_overlong_punishment(config.max_response_length, config.overlong_buffer_len)
        )

    responses = config.train_batch_size * config.group_size
    updates = config.updates_per_step
    trl_config = GRPOConfig(
        output_dir=str(run_dir / "trl"),
        report_to="none",
        use_cpu=True,
        bf16=precision == "bfloat16",
        gradient_checkpointing=False,
        seed=args.seed,
        data_seed=args.seed,
        loss_type="dapo",
        epsilon=config.clip_low,
        epsilon_high=config.clip_high,
        delta=config.clip_c,
        mask_truncated_completions=config.overlong_filter,
        beta=0.0,
        num_iterations=config.ppo_epochs,
        temperature=config.temperature,
        top_p=config.top_p,
        num_generations=config.group_size,
        max_completion_length=config.max_response_length,
        per_device_train_batch_size=config.micro_batch_size,
        gradient_accumulation_steps=responses // updates // config.micro_batch_size,
        steps_per_generation=responses // config.micro_batch_size,
        learning_rate=config.lr,
        warmup_steps=config.warmup_steps * updates,
        lr_scheduler_type="constant_with_warmup",
        weight_decay=config.weight_decay,
        max_grad_norm=config.grad_clip,
        max_steps=100_000,
        logging_steps=updates * args.eval_every,
        save_strategy="no",
        disable_tqdm=True,
    )

    curve_path = run_dir / "curve.jsonl"

    class HeldoutClock(TrainerCallback):
        """Held-out accuracy every `eval_every` generation batches, on a clock that stops while it
        measures."""

        def __init__(self) -> None:
            self.start = 0.0
            self.evaluating = 0.0

        def measure(self, batches: int, seconds: float) -> float:
            began = time.monotonic()
            result = heldout_now(engine, heldout_prompts, [p.answer for p in heldout], config)
            with curve_path.open("a") as file:
                file.write(
                    json.dumps(
                        {
                            "batches": batches,
                            "seconds": seconds,
                            "acc": result["acc"],
                            "acc_stderr": result["acc_stderr"],
                            "machine": cpu_description(),
                            "precision": "bf16 autocast" if trl_config.bf16 else "float32",
                        }
                    )
                    + "\n"
                )
            print(
                f"[trl seed {args.seed}] {batches} batches, {seconds / 60:.1f} min: held-out "
                f"{result['acc']:.1%}",
                flush=True,
            )
            self.evaluating += time.monotonic() - began
            return result["acc"]

        def on_train_begin(self, args_, state, control, **kwargs):
            self.measure(0, 0.0)
            self.start, self.evaluating = time.monotonic(), 0.0

        def on_step_end(self, args_, state, control, **kwargs):
            if state.global_step % (updates * args.eval_every):
                return
            seconds = time.monotonic() - self.start - self.evaluating
            acc = self.measure(state.global_step // updates, seconds)
            if acc >= args.target or seconds >= args.budget_minutes * 60:
                control.should_training_stop = True

    print(
        f"[trl seed {args.seed}] torch {torch.__version__}, transformers {transformers.__version__}, trl "
        f"{trl.__version__}, {torch.get_num_threads()} threads, "
        f"{'bf16 autocast' if trl_config.bf16 else 'float32'}",
        flush=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=trl_config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[HeldoutClock()],
    )
    trainer.train()
    (run_dir / "done").write_text("")


# ---- the summary
# -----------------------------------------------------------------------------------------------


def time_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first evaluation at or above `target`; None if none is."""
    return next((point["seconds"] for point in curve if point["acc"] >= target), None)


def accuracy_at(curve: list[dict], seconds: float) -> float:
    """Held-out accuracy of the last evaluation at or before `seconds` of training."""
    return [point["acc"] for point in curve if point["seconds"] <= seconds][-1]


def speedup(rows: list[dict], side: str) -> dict:
    """`side` against TRL over the seeds in `rows`: per-seed ratios of TRL's time to the target over the
    side's, their median, and the ratio of mean times. Where TRL never reached the target its run's end stands
    in, and the ratio is a lower bound (`lower_bound`); where the side never reached it, there is no ratio."""
    times = [row["time_to_target"][side] for row in rows]
    if any(value is None for value in times):
        return {"reached": sum(value is not None for value in times), "seeds": len(times)}
    trl = [row["time_to_target"]["trl"] or row["end_seconds"]["trl"] for row in rows]
    ratios = [theirs / ours for theirs, ours in zip(trl, times, strict=True)]
    return {
        "mean_seconds": statistics.mean(times),
        "trl_mean_seconds": statistics.mean(trl),
        "ratio": statistics.mean(trl) / statistics.mean(times),
        "per_seed": ratios,
        "median": statistics.median(ratios),
        "lower_bound": any(row["time_to_target"]["trl"] is None for row in rows),
    }


def summarize(curves: dict[str, dict[int, list[dict]]], target: float) -> dict:
    seeds = sorted(set(curves["ours"]) & set(curves["trl"]))
    rows = []
    for seed in seeds:
        present = {side: curves[side][seed] for side in SIDES if seed in curves[side]}
        common = min(curve[-1]["seconds"] for curve in present.values())
        rows.append(
            {
                "seed": seed,
                "start_acc": {side: c[0]["acc"] for side, c in present.items()},
                "time_to_target": {side: time_to(c, target) for side, c in present.items()},
                "end_seconds": {side: c[-1]["seconds"] for side, c in present.items()},
                "common_seconds": common,
                "acc_at_common": {side: accuracy_at(c, common) for side, c in present.items()},
            }
        )
    versus = {
        side: speedup([row for row in rows if side in row["time_to_target"]], side)
        for side in SIDES
        if side != "trl" and any(side in row["time_to_target"] for row in rows)
    }
    return {"target": target, "seeds": rows, "vs_trl": versus}


def summary_text(summary: dict) -> str:
    target = summary["target"]
    minutes = lambda value: "not reached" if value is None else f"{value / 60:.1f} min"  # noqa: E731
    sides = [side for side in SIDES if any(side in row["time_to_target"] for row in summary["seeds"])]
    lines = [
        f"time to {target:.0%} held-out accuracy (training time, evaluation excluded); "
        + "; ".join(f"{SHORT[side]} = {LABELS[side]}" for side in sides),
        f"{'seed':>4}  " + "".join(f"{SHORT[side]:>14}" for side in sides) + "   held-out at the same time",
    ]
    for row in summary["seeds"]:
        reach, same = row["time_to_target"], row["acc_at_common"]
        lines.append(
            f"{row['seed']:>4}  "
            + "".join(f"{minutes(reach.get(side)):>14}" for side in sides)
            + "   "
            + " / ".join(f"{same[side]:.1%}" for side in sides if side in same)
            + f" at {row['common_seconds'] / 60:.1f} min"
        )
    for side, versus in summary["vs_trl"].items():
        if "ratio" not in versus:
            lines.append(
                f"{SHORT[side]}: reached {target:.0%} in {versus['reached']} of {versus['seeds']} seeds: "
                "no ratio"
            )
            continue
        bound = "at least " if versus["lower_bound"] else ""
        verdict = "PASS" if versus["ratio"] >= 3 else ("not shown" if versus["lower_bound"] else "FAIL")
        lines.append(
            f"{SHORT[side]} against TRL: {bound}{versus['ratio']:.2f}x sooner in mean time "
            f"({versus['mean_seconds'] / 60:.1f} against {bound}{versus['trl_mean_seconds'] / 60:.1f} min); "
            f"per seed {', '.join(f'{r:.2f}x' for r in versus['per_seed'])}, median {bound}"
            f"{versus['median']:.2f}x (target >= 3x: {verdict})"
            + (
                "; TRL missed the target in some seed, its run's end counted: a lower bound"
                if versus["lower_bound"]
                else ""
            )
        )
    return "\n".join(lines)


def plot(curves: dict[str, dict[int, list[dict]]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    seeds = sorted(set(curves["ours"]) & set(curves["trl"]))  # the seeds the summary compares
    for side, color in zip(SIDES, ("tab:blue", "tab:green", "tab:orange"), strict=True):
        for index, curve in enumerate(curves[side][seed] for seed in seeds if seed in curves[side]):
            axes.plot(
                [p["seconds"] / 60 for p in curve],
                [p["acc"] for p in curve],
                color=color,
                marker="o",
                markersize=3,
                alpha=0.8,
                label=LABELS[side] if index == 0 else None,
            )
    axes.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:.0%}")
    axes.set_xlabel("training time, minutes (evaluation excluded)")
    axes.set_ylabel("held-out accuracy (avg@2)")
    axes.set_title("SmolLM2-135M on the arithmetic task, one line per seed")
    axes.legend(loc="upper right", fontsize=8)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_results(results: Path, target: float) -> str:
    records = [json.loads(line) for line in (results / "curves.jsonl").read_text().splitlines()]
    curves: dict[str, dict[int, list[dict]]] = {side: {} for side in SIDES}
    for record in records:
        curves[record["side"]].setdefault(record["seed"], []).append(record)
    summary = summarize(curves, target)
    text = summary_text(summary)
    (results / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (results / "summary.txt").write_text(text + "\n")
    plot(curves, target, results / "time_to_accuracy.png")
    return text


def record_curve(results: Path, side: str, seed: int, curve: list[dict]) -> None:
    """Replace the side's and seed's points in curves.jsonl with `curve`."""
    path = results / "curves.jsonl"
    records = [json.loads(line) for line in (path.read_text().splitlines() if path.is_file() else [])]
    kept = [record for record in records if (record["side"], record["seed"]) != (side, seed)]
    added = [{"side": side, "seed": seed, **point} for point in curve]
    path.write_text("".join(json.dumps(record) + "\n" for record in kept + added))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=5, help="seeds 0..N-1 for each side")
    parser.add_argument("--sides", default=",".join(SIDES), help=f"comma list of {', '.join(SIDES)}")
    parser.add_argument("--steps", type=int, default=20, help="ours: rollout batches (DAPO steps) per run")
    parser.add_argument(
        "--eval-every", type=int, default=2, help="held-out evaluation every N rollout batches"
    )
    parser.add_argument("--target", type=float, default=0.5, help="held-out accuracy whose time is compared")
    parser.add_argument(
        "--heldout-size",
        type=int,
        help="held-out problems per evaluation, both sides (default: the "
        "dapo preset's 100); fewer for a quick check, whose times are not comparable with the results'",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=45.0,
        help="TRL: training minutes after which a run that has not reached --target stops",
    )
    parser.add_argument(
        "--trl-reward",
        choices=["correctness", "dapo"],
        default="correctness",
        help="TRL's reward: the correctness score alone (the comparison), or with TRL's "
        "get_soft_overlong_punishment added (dapo: tried, see the results README)",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run (pin with taskset)")
    parser.add_argument(
        "--out", default="runs/time-to-accuracy", help="run directories (checkpoints: not kept)"
    )
    parser.add_argument(
        "--results",
        default="docs/results/time-to-accuracy",
        help="curves.jsonl, summary.json/txt and the plot",
    )
    parser.add_argument(
        "--summary-only", action="store_true", help="rebuild the summary and plot from --results"
    )
    parser.add_argument("--side", choices=["trl"], help=argparse.SUPPRESS)  # the child process
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--run-dir", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side == "trl":
        train_trl(args)
        return
    sides = [side for side in args.sides.split(",") if side]
    if set(sides) - set(SIDES):
        parser.error(f"--sides: {', '.join(sorted(set(sides) - set(SIDES)))} not one of {', '.join(SIDES)}")
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    if not args.summary_only:
        for seed in range(args.seeds):
            for side in sides:
                run_dir = Path(args.out) / side / f"seed-{seed}"
                if not finished(side, run_dir):
                    print(f"[time-to-accuracy] {side} seed {seed}: {cpu_line()}", flush=True)
                    RUNNERS[side](args, seed, run_dir)
                curve = (
                    ours_curve(run_dir)
                    if side != "trl"
                    else [json.loads(line) for line in (run_dir / "curve.jsonl").read_text().splitlines()]
                )
                record_curve(results, side, seed, curve)
                remove_checkpoints(run_dir)  # GBs each; the curve is what is kept
        print(f"[time-to-accuracy] done: {cpu_line()}")
    print(write_results(results, args.target))


RUNNERS = {
    "ours": run_ours,
    "trl": run_trl,
    "ours-trl-settings": lambda args, seed, run_dir: run_ours(
        args,
        seed,
        run_dir,
        trl_settings(shared_config(seed, str(run_dir), args.eval_every, args.heldout_size)),
    ),
}


def finished(side: str, run_dir: Path) -> bool:
    if side == "trl":
        return (run_dir / "done").is_file()
    summary = run_dir / "summary.json"
    return (run_dir / REACHED).is_file() or (summary.is_file() and "after" in json.loads(summary.read_text()))


if __name__ == "__main__":
    main()
