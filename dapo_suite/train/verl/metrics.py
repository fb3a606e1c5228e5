"""verl's logged metrics as the embedded trainer's `metrics.jsonl`, so `train plot` and `report` draw a verl
run.

verl's "file" logger writes RUN_DIR/verl_metrics.jsonl (`{"step": N, "data": {...}}` per step, truncated when
a run starts, so the launcher first moves an earlier attempt's file aside as verl_metrics.K.jsonl).
`write_metrics` merges every attempt (a later attempt's step replaces an earlier one's) into
RUN_DIR/metrics.jsonl: each record holds verl's own names and, beside them, the embedded trainer's names for
the quantities both log.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from dapo_suite.train.verl.keys import VERL_METRICS_FILE

# verl 0.9.1's metric -> the embedded trainer's name for the same quantity
SAME_QUANTITY = {
    "critic/rewards/mean": "reward/mean",
    "actor/entropy": "actor/entropy",
    "response_length/mean": "response_len/mean",
    "response_length/max": "response_len/max",
    "response_length/clip_ratio": "response_len/clip_ratio",
    "timing_s/step": "perf/step_seconds",
}
# held-out accuracy: verl logs val-core/<data_source>/acc/mean@<n>
VALIDATION_ACC = re.compile(r"^val-core/[^/]+/acc/mean@\d+$")


def attempt_files(run_dir: Path) -> list[Path]:
    """verl_metrics.1.jsonl, .2, ... (earlier attempts, oldest first), then verl_metrics.jsonl (the
    newest)."""
    stem = VERL_METRICS_FILE.removesuffix(".jsonl")
    earlier = sorted(run_dir.glob(f"{stem}.*.jsonl"), key=lambda p: int(p.name.split(".")[1]))
    newest = run_dir / VERL_METRICS_FILE
    return earlier + ([newest] if newest.is_file() else [])


def keep_earlier_attempt(run_dir: Path) -> None:
    """Move the previous attempt's file aside before verl truncates it (a resumed run)."""
    newest = run_dir / VERL_METRICS_FILE
    if newest.is_file() and newest.stat().st_size:
        newest.rename(
            run_dir / f"{VERL_METRICS_FILE.removesuffix('.jsonl')}.{len(attempt_files(run_dir))}.jsonl"
        )


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def translate(step: int, data: dict[str, Any]) -> dict[str, float]:
    """One verl record as a metrics.jsonl record: verl's numeric metrics plus the embedded trainer's names."""
    record: dict[str, float] = {"step": step}
    for name, value in data.items():
        number = _number(value)
        if number is None:
            continue
        record[name] = number
        if name in SAME_QUANTITY:
            record[SAME_QUANTITY[name]] = number
        elif VALIDATION_ACC.match(name):
            record["val/acc"] = number
    return record


def write_metrics(run_dir: Path) -> Path | None:
    """RUN_DIR/metrics.jsonl from every attempt's verl log; None when verl logged nothing."""
    steps: dict[int, dict[str, float]] = {}
    for path in attempt_files(run_dir):
        for line in path.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                step = int(entry["step"])
                steps.setdefault(step, {}).update(translate(step, entry.get("data", {})))
    if not steps:
        return None
    target = run_dir / "metrics.jsonl"
    target.write_text("".join(json.dumps(steps[step]) + "\n" for step in sorted(steps)))
    return target
