"""Evaluation sets: the four shipped with the package (`eval/benchmarks/*.jsonl`) and any jsonl/parquet file.

A problem is `Problem(id, problem, answer, extra)`; `answer` is always a string (integers as plain digits), the
form `dapo_suite.reward.compute_score` grades against. Provenance of the shipped files:
`/work/shared/data/PROVENANCE.md` (AIME/AMC statements are (c) MAA: evaluation use only).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from dapo_suite.errors import UserError
from dapo_suite.tasks import read_jsonl

# name -> (rows, what it is); the rows are checked by tests/test_eval_data.py
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
    extra: dict = field(default_factory=dict)


def benchmark_path(name: str) -> Path:
    """The jsonl file of a shipped benchmark."""
    if name not in BENCHMARKS:
        raise ValueError(f"Unknown benchmark {name!r}: choose one of {', '.join(BENCHMARKS)}, or pass --file PATH.")
    return Path(str(resources.files("eval") / "benchmarks" / f"{name}.jsonl"))


def answer_text(value: object) -> str:
    """Ground truth as a string; whole floats (AMC's 27.0) become digits."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


def read_rows(path: str | Path) -> list[dict]:
    """Rows of a .jsonl or .parquet file."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"--file {path}: no such file.")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    return read_jsonl(path)


def _lookup(row: dict, key: str):
    """`row[key]`, where a dotted key reads nested fields (`reward_model.ground_truth`)."""
    value = row
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            raise KeyError(part)
        value = value[part]
    return value


def load_problems(
    benchmark: str | None = None,
    file: str | None = None,
    problem_key: str = "problem",
    answer_key: str = "answer",
    id_key: str = "id",
    limit: int | None = None,
) -> list[Problem]:
    """The first `limit` problems of a shipped benchmark or of a file (ids default to the row number)."""
    rows = read_rows(file if file else benchmark_path(benchmark or ""))
    problems = []
    for index, row in enumerate(rows[:limit] if limit else rows):
        try:
            text, answer = _lookup(row, problem_key), _lookup(row, answer_key)
        except KeyError as missing:
            raise UserError(
                f"Row {index + 1} of {file or benchmark} has no field {missing}; its fields are {sorted(row)}. "
                "Pass --problem-key and --answer-key."
            ) from None
        if isinstance(text, list):  # a verl chat prompt: take the last user message
            text = [m["content"] for m in text if m.get("role") == "user"][-1]
        if answer is None or not answer_text(answer):
            where = "row" if str(file).endswith(".parquet") else "line"
            raise UserError(f"{file or benchmark} {where} {index + 1}: the answer ({answer_key}) is empty, so every "
                            "sample would be graded wrong; fill it in or remove the row.")
        problem_id = row.get(id_key, index)
        extra = {k: row[k] for k in ("subject", "level") if k in row}
        problems.append(Problem(str(problem_id), str(text), answer_text(answer), extra))
    if len({p.id for p in problems}) != len(problems):
        raise ValueError(f"{file or benchmark}: the field {id_key!r} is not unique; pass --id-key.")
    return problems
