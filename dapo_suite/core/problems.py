"""The problem record every stage shares, the one reader of problem files, and where the shipped benchmarks
lie.

A problem is `Problem(id, problem, answer, extra)`: `answer` is a string (integers as plain digits), the form
`dapo_suite.core.reward.compute_score` grades against; `extra` keeps what a benchmark reports by (subject,
level). The training set reader (`dapo_suite.train.tasks`), the evaluator (`eval.data`), the chat
(`serve.chat`) and the data build (`data_pipeline.sources`) read files with `read_rows` and find benchmarks
with `benchmark_path`. Provenance of the shipped files: docs/eval.md, "Benchmarks" (AIME/AMC statements are
(c) MAA: evaluation use only).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError

# name -> (rows, what it is); shipped as package data beside this module (core/benchmarks/NAME.jsonl), rows
# checked by tests/eval/test_eval_data.py
BENCHMARKS = {
    "aime24": (30, "AIME 2024 I and II, integer answers 0-999 (the paper's headline benchmark)"),
    "amc23": (40, "AMC 2023, integer answers (overlaps DAPO-Math-17k: 8 exact duplicates)"),
    "math500": (500, "MATH-500, LaTeX answers graded symbolically; keeps subject and level"),
    "gsm8k": (1319, "GSM8K test, integer answers (the number after ####)"),
}


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str
    extra: dict = field(default_factory=dict, hash=False)


def benchmark_path(name: str) -> Path:
    """The jsonl file of a shipped benchmark."""
    if name not in BENCHMARKS:
        raise ValueError(
            f"Unknown benchmark {name!r}: choose one of {', '.join(BENCHMARKS)}, or pass --file PATH."
        )
    return Path(str(resources.files("dapo_suite.core") / "benchmarks" / f"{name}.jsonl"))


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a jsonl, json (a list, or {"data": [...]}), parquet or csv/tsv file, as dicts; blank jsonl
    lines are skipped and a line that is not JSON is named by its number."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        with path.open(encoding="utf-8") as handle:
            for number, line in enumerate(handle, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as error:
                        raise UserError(
                            f"{path} line {number}: not valid JSON ({error.msg}); fix or remove it"
                        ) from None
        return rows
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(data, dict):
            data = next((v for v in data.values() if isinstance(v, list)), [data])
        return list(data)
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix in (".csv", ".tsv"):
        import csv

        with path.open(encoding="utf-8", newline="") as handle:
            return list(csv.DictReader(handle, delimiter="\t" if suffix == ".tsv" else ","))
    raise UserError(f"{path}: unknown format {suffix!r} (use .jsonl, .json, .parquet or .csv)")
