"""`data build` as a list of steps, each with one `run(rows, ctx) -> StepResult`.

Each step writes its rows to DIR/stages/NN_name.jsonl and a DIR/stages/NN_name.meta.json (count, counters,
report, fingerprint) last; a rerun skips every step whose fingerprint (its inputs' fingerprint plus the config
fields it reads) is unchanged and resumes at the first one that changed or never finished. The LLM step also
keeps an append-only request cache (DIR/llm_cache.jsonl), so a crash inside it loses no paid-for answer.
Dropped rows go to DIR/reports/NAME.dropped.jsonl with a reason ("kind: detail"); kinds are counted in
stats.json, and DIR/rejected.jsonl gathers every step's dropped rows (build.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from data_pipeline.config import BuildConfig


@dataclass
class StepResult:
    rows: list[dict[str, Any]]
    dropped: list[dict[str, Any]] = field(default_factory=list)  # each with a "reason"
    report: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    config: BuildConfig
    out: Path
    log: Callable[[str], None] = print
    metas: dict[str, dict[str, Any]] = field(default_factory=dict)  # step name -> meta of the finished step


class Step:
    """One stage. `reads` names the config fields whose change must rerun it (and every later step)."""

    name: str = ""
    reads: tuple[str, ...] = ()

    def run(self, rows: list[dict[str, Any]], ctx: Context) -> StepResult:
        raise NotImplementedError

    def salt(self, config: BuildConfig) -> str:
        """Extra fingerprint input beyond the config fields (e.g. source file sizes)."""
        return ""


def reason_kind(reason: str) -> str:
    """The counter a reason goes to: its text before the first colon ("missing_answer: no field ..." ->
    "missing_answer"); the rest is the detail rejected.jsonl keeps."""
    return reason.split(":", 1)[0]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    """Atomic write: a crash mid-write leaves the previous file or none, never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def run_pipeline(steps: list[Step], ctx: Context) -> list[dict[str, Any]]:
    """Run or resume every step; returns the last step's rows."""
    stages = ctx.out / "stages"
    reports = ctx.out / "reports"
    stages.mkdir(parents=True, exist_ok=True)
    reports.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    fingerprint = "dapo-suite-data-v1"
    for number, step in enumerate(steps):
        settings = {name: getattr(ctx.config, name) for name in step.reads}
        fingerprint = hashlib.sha256(
            json.dumps(
                [fingerprint, step.name, settings, step.salt(ctx.config)], sort_keys=True, default=str
            ).encode()
        ).hexdigest()[:16]
        stem = stages / f"{number:02d}_{step.name}"
        meta_path, rows_path = stem.with_suffix(".meta.json"), stem.with_suffix(".jsonl")
        if meta_path.is_file() and rows_path.is_file():
            meta = json.loads(meta_path.read_text())
            if meta.get("fingerprint") == fingerprint:
                rows = read_jsonl(rows_path)
                ctx.metas[step.name] = meta
                ctx.log(f"[{step.name}] resumed: {meta['count']} rows (unchanged since the last run)")
                continue
        rows_in = len(rows)
        result = step.run(rows, ctx)
        rows = result.rows
        write_jsonl(rows_path, rows)
        write_jsonl(reports / f"{step.name}.dropped.jsonl", result.dropped)
        meta = {
            "step": step.name,
            "fingerprint": fingerprint,
            "count_in": rows_in,
            "count": len(rows),
            "dropped": dict(Counter(reason_kind(d["reason"]) for d in result.dropped)),
            "report": result.report,
        }
        tmp = meta_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=1, default=str))
        os.replace(tmp, meta_path)
        ctx.metas[step.name] = meta
        dropped = ", ".join(f"{k} {v}" for k, v in meta["dropped"].items()) or "none"
        ctx.log(f"[{step.name}] {rows_in} -> {len(rows)} rows (dropped: {dropped})")
    return rows
