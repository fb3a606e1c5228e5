"""Evaluation sets: the four shipped benchmarks (`dapo_suite.core.problems.BENCHMARKS`) and any jsonl/parquet
file, read into the shared `Problem` record by field name (`--problem-key`, `--answer-key`, `--id-key`)."""

from __future__ import annotations

from pathlib import Path

from dapo_suite.core.errors import UserError
from dapo_suite.core.problems import Problem, benchmark_path, read_rows


def answer_text(value: object) -> str:
    """Ground truth as a string; whole floats (AMC's 27.0) become digits."""
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


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
    path = Path(file) if file else benchmark_path(benchmark or "")
    if not path.is_file():
        raise UserError(f"--file {path}: no such file.")
    rows = read_rows(path)
    problems = []
    for index, row in enumerate(rows[:limit] if limit else rows):
        try:
            text, answer = _lookup(row, problem_key), _lookup(row, answer_key)
        except KeyError as missing:
            raise UserError(
                f"Row {index + 1} of {file or benchmark} has no field {missing}; its fields are "
                f"{sorted(row)}. Pass --problem-key and --answer-key."
            ) from None
        if isinstance(text, list):  # a verl chat prompt: take the last user message
            text = [m["content"] for m in text if m.get("role") == "user"][-1]
        if answer is None or not answer_text(answer):
            where = "row" if str(file).endswith(".parquet") else "line"
            raise UserError(
                f"{file or benchmark} {where} {index + 1}: the answer ({answer_key}) is empty, so every "
                "sample would be graded wrong; fill it in or remove the row."
            )
        problem_id = row.get(id_key, index)
        extra = {k: row[k] for k in ("subject", "level") if k in row}
        problems.append(Problem(str(problem_id), str(text), answer_text(answer), extra))
    if len({p.id for p in problems}) != len(problems):
        raise ValueError(f"{file or benchmark}: the field {id_key!r} is not unique; pass --id-key.")
    return problems
