"""The verl run against the embedded run, step by step: reward, entropy, length, step time, held-out accuracy.
Usage: python docs/results/verl-cpu/compare.py VERL_RUN EMBEDDED_RUN   (prints a markdown table)"""

import sys
from pathlib import Path

from dapo_suite.train.run_log import read_metrics

COLUMNS = [
    ("reward/mean", "reward", "{:+.3f}"),
    ("actor/entropy", "entropy", "{:.3f}"),
    ("response_len/mean", "length", "{:.1f}"),
    ("actor/grad_norm", "grad norm", "{:.3f}"),
    ("perf/step_seconds", "step s", "{:.0f}"),
    ("val/acc", "held-out acc", "{:.3f}"),
]


def steps(run: Path) -> dict[int, dict]:
    merged: dict[int, dict] = {}
    for record in read_metrics(run):
        merged.setdefault(int(record["step"]), {}).update(record)
    return merged


def main(verl_run: str, embedded_run: str) -> None:
    runs = {"verl": steps(Path(verl_run)), "embedded": steps(Path(embedded_run))}
    print("| step | trainer | " + " | ".join(title for _, title, _ in COLUMNS) + " |")
    print("|---|---|" + "---|" * len(COLUMNS))
    for step in sorted(set(runs["verl"]) | set(runs["embedded"])):
        for name, records in runs.items():
            record = records.get(step, {})
            cells = [fmt.format(record[key]) if key in record else "" for key, _, fmt in COLUMNS]
            print(f"| {step} | {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(*sys.argv[1:3])
