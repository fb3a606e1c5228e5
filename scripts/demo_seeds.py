"""The demo's training stage over many seeds, in bf16, in float32, with LoRA and with int8 rollouts:
docs/results/demo/ (the table), docs/results/quantized-rollouts/ (int8).

Each run is `dapo-suite train --preset dapo --train-file <the demo's data> --seed S` (what `make demo` runs),
plus its arm's settings (`ARMS`): none for bf16 (the default where bf16 is native),
`--set sampling_dtype=null --set autocast_dtype=null` for float32 (the precision of a CPU without native
bf16), LoRA adapters for lora-bf16, `--set rollout_quantization=int8` for int8-rollouts (bf16 training,
the sampler's copy of the weights in int8, rollout correction on). Finished runs are kept and skipped,
unfinished ones resumed, so a rerun continues where it stopped.

    python scripts/demo_seeds.py --seeds 10 --arms bf16 float32 --out runs/demo-seeds
    python scripts/demo_seeds.py --out runs/demo-seeds --table docs/results/demo    # the table from finished
    runs python scripts/demo_seeds.py --rerender docs/results/demo    # seeds.md again from the committed
    seeds.json
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
from pathlib import Path

from dapo_suite.core.provenance import cpu_description
from dapo_suite.demo import EARLY_STEPS, early_signal, meets_demo_target
from dapo_suite.train.run_log import read_metrics

ARMS = {
    "bf16": [],
    "float32": ["--set", "sampling_dtype=null", "--set", "autocast_dtype=null"],
    # LoRA's learning rate 10x full fine-tuning's: the ratio "LoRA Without Regret" (Schulman et al., Thinking
    # Machines, 2025) measured optimal across models, RL included; chosen before any run, not on held-out
    # results
    "lora-bf16": [
        "--set",
        "lora_rank=16",
        "--set",
        "lora_alpha=32",
        "--set",
        "lora_targets=all-linear",
        "--set",
        "lr=3e-4",
    ],
    "int8-rollouts": ["--set", "rollout_quantization=int8"],
}


def build_data(out: Path) -> Path:
    data = out / "data"
    if not (data / "train.parquet").is_file():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "dapo_suite.cli",
                "data",
                "build",
                "--input",
                "arithmetic",
                "--out",
                str(data),
            ],
            check=True,
            capture_output=True,
        )
    return data / "train.parquet"


def finished(run: Path) -> bool:
    summary = run / "summary.json"
    return summary.is_file() and "verdict" in json.loads(summary.read_text())


def launch(run: Path, data: Path, seed: int, arm: str, threads: int) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "dapo_suite.cli",
        "train",
        "--preset",
        "dapo",
        "--train-file",
        str(data),
        "--seed",
        str(seed),
        "--out",
        str(run),
        *ARMS[arm],
    ]
    if (run / "metrics.jsonl").is_file():
        command.append("--resume")
    run.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.Popen(
        command, stdout=open(run / "stdout.log", "w"), stderr=open(run / "stderr.log", "w"), env=env
    )


def run_all(out: Path, seeds: list[int], arms: list[str], parallel: int, threads: int) -> None:
    data = build_data(out)
    queue = [(seed, arm) for arm in arms for seed in seeds if not finished(out / arm / f"seed{seed}")]
    running: list[tuple[subprocess.Popen, str, Path]] = []
    while queue or running:
        while queue and len(running) < parallel:
            seed, arm = queue.pop(0)
            run = out / arm / f"seed{seed}"
            running.append((launch(run, data, seed, arm, threads), f"{arm} seed {seed}", run))
        time.sleep(5)
        for process, name, run in [r for r in running if r[0].poll() is not None]:
            running.remove((process, name, run))
            print(f"{name}: exit {process.returncode}", flush=True)
            if finished(
                run
            ):  # the table reads metrics and summary; ~1.6 GB of checkpoints a run would fill a disk
                shutil.rmtree(run / "checkpoints", ignore_errors=True)
                (run / "checkpoint-last").unlink(missing_ok=True)


def run_row(run: Path, seed: int, arm: str) -> dict:
    summary = json.loads((run / "summary.json").read_text())
    steps = [s for s in read_metrics(run) if "sampling/groups_kept" in s]
    mixed = [s["step"] for s in steps if s["sampling/groups_mixed"] > 0]
    config = (run / "config.yaml").read_text()
    before, after = summary["before"]["acc"], summary["after"]["acc"]
    return {
        "seed": seed,
        "arm": arm,
        "before": before,
        "after": after,
        "rise": after - before,
        "meets_target": meets_demo_target(before, after),
        "updates": sum(s["sampling/groups_kept"] > 0 for s in steps),
        "steps": len(steps),
        "first_mixed_step": mixed[0] if mixed else None,
        "format_rate": [round(s["reward/format_rate"], 4) for s in steps],
        "train_acc": [round(s["reward/acc"], 4) for s in steps],
        "gen_batches": [s["sampling/gen_batches"] for s in steps],
        "step_seconds": [round(s.get("perf/step_seconds", 0.0), 1) for s in steps],
        "verdict": summary["verdict"]["text"],
        "sampling_dtype": next(
            (
                line.split(":", 1)[1].strip()
                for line in config.splitlines()
                if line.startswith("sampling_dtype:")
            ),
            None,
        ),
    }


def write_table(out: Path, table_dir: Path, machine: str) -> None:
    rows = [
        run_row(run, int(run.name[4:]), arm)
        for arm in ARMS
        if (out / arm).is_dir()
        for run in sorted((out / arm).glob("seed*"), key=lambda r: int(r.name[4:]))
        if finished(run)
    ]
    table_dir.mkdir(parents=True, exist_ok=True)
    (table_dir / "seeds.json").write_text(json.dumps({"machine": machine, "runs": rows}, indent=1))
    render_table(rows, machine, table_dir)


def render_table(rows: list[dict], machine: str, table_dir: Path) -> None:
    """seeds.md from the rows of seeds.json: per run, the target and the guard's early signal beside it."""
    lines = [
        f"Machine: {machine}.",
        "",
        f"| arm | seed | held-out before | after | rise | target | early signal | updates | first mixed step "
        f"| format rate, step 1 -> {EARLY_STEPS} -> last | train acc, step 1 -> {EARLY_STEPS} -> last |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        met, early = (
            meets_demo_target(r["before"], r["after"]),
            early_signal(r["train_acc"], r["format_rate"]),
        )
        lines.append(
            f"| {r['arm']} | {r['seed']} | {100 * r['before']:.1f} % | {100 * r['after']:.1f} % | "
            f"{100 * r['rise']:+.1f} | {'met' if met else 'missed'} | {'yes' if early else 'no'} | "
            f"{r['updates']}/{r['steps']} | {r['first_mixed_step']} | "
            + " | ".join(
                " -> ".join(f"{100 * series[i]:.0f}" for i in (0, EARLY_STEPS - 1, -1)) + " %"
                for series in (r["format_rate"], r["train_acc"])
            )
            + " |"
        )
    lines.append("")
    for arm in ARMS:
        group = sorted(r["after"] for r in rows if r["arm"] == arm)
        if group:
            arm_rows = [r for r in rows if r["arm"] == arm]
            met = sum(meets_demo_target(r["before"], r["after"]) for r in arm_rows)
            agree = sum(
                meets_demo_target(r["before"], r["after"]) == early_signal(r["train_acc"], r["format_rate"])
                for r in arm_rows
            )
            median = statistics.median(group)
            lines.append(
                f"- {arm}: target met in {met} of {len(group)} seeds; held-out after: median "
                f"{100 * median:.1f} %, range {100 * group[0]:.1f}-{100 * group[-1]:.1f} %; early signal "
                f"agrees with the target in {agree} of {len(group)}"
            )
    (table_dir / "seeds.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("runs/demo-seeds"))
    parser.add_argument("--seeds", type=int, default=0, help="Train seeds 0..N-1 (0: only write the table).")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=["bf16", "float32"])
    parser.add_argument("--parallel", type=int, default=1, help="Runs at a time.")
    parser.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 1)), help="Threads per run.")
    parser.add_argument("--table", type=Path, help="Write seeds.md and seeds.json into this folder.")
    parser.add_argument(
        "--machine",
        default=cpu_description(),
        help="The CPU the runs ran on, for the table's first line [default: this machine's, as recorded].",
    )
    parser.add_argument("--rerender", type=Path, help="Write seeds.md again from this folder's seeds.json.")
    args = parser.parse_args()
    if args.rerender:
        table = json.loads((args.rerender / "seeds.json").read_text())
        render_table(table["runs"], table["machine"], args.rerender)
    if args.seeds:
        run_all(
            args.out,
            list(range(args.first_seed, args.first_seed + args.seeds)),
            args.arms,
            args.parallel,
            args.threads,
        )
    if args.table:
        write_table(args.out, args.table, args.machine)


if __name__ == "__main__":
    main()
