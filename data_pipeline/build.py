"""`run_build`: the whole `data build` as one call (the CLI and the benchmark both use it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError
from dapo_suite.core.lock import output_lock
from dapo_suite.core.provenance import provenance
from data_pipeline.config import BuildConfig
from data_pipeline.export import build_stats, dataset_card, format_ledger
from data_pipeline.pipeline import Context, read_jsonl, reason_kind, run_pipeline, write_jsonl
from data_pipeline.steps import build_steps


def run_build(config: BuildConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run or resume the pipeline into config.out; writes train.parquet, rejected.jsonl (every row not
    exported, with its stage and reason), stats.json (with the ledger), README.md, config.json."""
    if not config.inputs:
        raise UserError("no input: pass --input (a named source such as math_train, a file, or hf:ID).")
    with output_lock(config.out, warn=lambda message: log(f"warning: {message}")) as out:
        return _build(config, out, log)


def _build(config: BuildConfig, out: Path, log: Callable[[str], None]) -> dict[str, Any]:
    (out / "config.json").write_text(json.dumps({**config.to_dict(), **provenance()}, indent=1))
    ctx = Context(config, out, log)
    rows = run_pipeline(build_steps(), ctx)
    rejected = [
        {"stage": step, **row}
        for step in ctx.metas
        for row in read_jsonl(out / "reports" / f"{step}.dropped.jsonl")
    ]
    write_jsonl(out / "rejected.jsonl", rejected)
    stats = build_stats(ctx.metas, rows, config)
    (out / "stats.json").write_text(json.dumps(stats, indent=1, default=str))
    (out / "README.md").write_text(dataset_card(stats, rows))
    log(f"ledger: {format_ledger(stats['ledger'])}")
    if not stats["ledger"]["balanced"]:
        raise RuntimeError(f"the ledger does not balance: {stats['ledger']}")
    if not stats["ledger"]["input_rows"]:
        raise UserError(f"--input {', '.join(config.inputs)}: no rows to read (empty file, or --limit 0).")
    kinds = {reason_kind(row["reason"]) for row in rejected}
    if not rows and len(kinds) == 1:
        raise UserError(
            f"every one of the {len(rejected)} input rows was rejected for the same reason; the first: "
            f"{rejected[0].get('source')} row {rejected[0].get('row')}: {rejected[0]['reason']} "
            f"(all in {out / 'rejected.jsonl'})"
        )
    return stats
