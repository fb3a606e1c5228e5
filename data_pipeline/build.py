"""`run_build`: the whole `data build` as one call (the CLI and the benchmark both use it)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from data_pipeline.config import BuildConfig
from data_pipeline.export import build_stats, dataset_card
from data_pipeline.pipeline import Context, run_pipeline
from data_pipeline.steps import build_steps


def run_build(config: BuildConfig, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run or resume the pipeline into config.out; writes train.parquet, stats.json, README.md, config.json."""
    if not config.inputs:
        raise ValueError("no input: pass --input (a named source such as math_train, a file, or hf:ID).")
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config.to_dict(), indent=1))
    ctx = Context(config, out, log)
    rows = run_pipeline(build_steps(), ctx)
    stats = build_stats(ctx.metas, rows, config)
    (out / "stats.json").write_text(json.dumps(stats, indent=1, default=str))
    (out / "README.md").write_text(dataset_card(stats, rows))
    return stats
