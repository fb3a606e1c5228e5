"""Reading problem/answer pairs from anywhere: files (jsonl, json, parquet, csv), Hugging Face dataset ids
(`hf:owner/name[@config][:split]`, when the hub or its local cache answers) and the named raw sets the project
ships.

Every row becomes `{"id", "source", "row", "problem", "answer", "solution_steps"}` (the steps of a GSM8K-style
worked solution, else None). Rows whose problem or answer is missing or empty
are returned separately as `{"source", "row", "reason"}` so the build reports them instead of dropping them.
Fields are found by name (dotted paths reach into nested fields: `prompt.0.content`,
`reward_model.ground_truth`); without a name, the usual spellings are tried in order (problem/question/prompt,
answer/ground_truth/solution).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError
from dapo_suite.core.problems import BENCHMARKS, benchmark_path, read_rows
from data_pipeline.answers import gsm8k_final_answer, solution_steps

DATA_ENV = "DAPO_SUITE_DATA"
# name -> path under the data root (docs/data.md lists each file and where it comes from)
NAMED_SOURCES = {
    "math_train": "math_train/train.jsonl",
    "gsm8k": "gsm8k/train.jsonl",
    "dapo_math_17k": "dapo_math_17k/dapo_math_17k.parquet",
}
# name -> the Hugging Face dataset that holds the same rows, for a machine without the data root
HUB_SOURCES = {
    "math_train": "hf:nlile/hendrycks-MATH-benchmark:train",
    "gsm8k": "hf:openai/gsm8k@main:train",
    "dapo_math_17k": "hf:BytedTsinghua-SIA/DAPO-Math-17k:train",
}
# named sources shipped inside this package (no data root needed); docs/data.md says what each holds
SHIPPED_SOURCES = {"arithmetic": Path(__file__).parent / "raw" / "arithmetic.jsonl"}
EVAL_SETS = tuple(BENCHMARKS)
# where each evaluation set lies under the raw data root when the `eval` package does not ship it
_EVAL_RAW = {
    "aime24": "aime24/test.normalized.jsonl",
    "amc23": "amc23/test.normalized.jsonl",
    "math500": "math500/test.jsonl",
    "gsm8k": "gsm8k/test.jsonl",
}
PROBLEM_FIELDS = ("problem", "question", "prompt.0.content", "prompt", "input")
ANSWER_FIELDS = ("answer", "reward_model.ground_truth", "ground_truth", "final_answer", "solution")


class SourceError(UserError):
    """A source that cannot be read; the message says which flag or variable to set."""


def default_data_root() -> Path:
    """$DAPO_SUITE_DATA, else the per-user cache folder ($XDG_CACHE_HOME or ~/.cache, then
    dapo-suite/data)."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "dapo-suite" / "data"


def resolve_source(spec: str, data_root: Path | None = None) -> tuple[str, str | Path]:
    """(kind, location) for a --input value: ('named'|'file'|'hf', path or dataset id)."""
    if spec in SHIPPED_SOURCES:
        return "named", SHIPPED_SOURCES[spec]
    if spec in NAMED_SOURCES:
        root = Path(data_root) if data_root else default_data_root()
        path = root / NAMED_SOURCES[spec]
        if not path.is_file():
            raise SourceError(
                f"--input {spec}: {path} not found. Put the file there, or point --data-root or ${DATA_ENV} "
                f"at the folder that holds {NAMED_SOURCES[spec]}; with network access, --input "
                f"{HUB_SOURCES[spec]} reads the same set from the Hugging Face hub."
            )
        return "named", path
    if spec.startswith("hf:"):
        return "hf", spec[3:]
    path = Path(spec).expanduser()
    if path.is_file():
        return "file", path
    raise SourceError(
        f"--input {spec}: no such file, and not a named source "
        f"({', '.join([*SHIPPED_SOURCES, *NAMED_SOURCES])}) or hf:ID."
    )


def _read_hf(dataset_id: str) -> Iterator[dict[str, Any]]:
    name, _, split = dataset_id.partition(":")
    name, _, subset = name.partition("@")
    try:
        import datasets

        dataset = datasets.load_dataset(name, subset or None, split=split or "train")
    except Exception as error:  # offline, unknown id, gated: all say the same thing to the user
        raise SourceError(
            f"--input hf:{dataset_id}: could not load from the Hugging Face hub ({error})."
        ) from None
    yield from dataset


def get_field(record: dict[str, Any], path: str) -> Any:
    """record['a']['b'][0] for 'a.b.0'; None when any step is missing."""
    value: Any = record
    for part in path.split("."):
        if isinstance(value, dict):
            value = value.get(part)
        elif isinstance(value, (list, tuple)) or hasattr(value, "__getitem__") and not isinstance(value, str):
            try:
                value = value[int(part)]
            except (ValueError, IndexError, TypeError):
                return None
        else:
            return None
        if value is None:
            return None
    return value


def _first_field(record: dict[str, Any], names: tuple[str, ...]) -> Any:
    for name in names:
        value = get_field(record, name)
        if value is not None and not isinstance(value, (dict, list)):
            return value
    return None


def load_source(
    spec: str,
    data_root: Path | None = None,
    problem_field: str | None = None,
    answer_field: str | None = None,
    limit: int | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(rows, invalid) for one --input. Row numbers count from 0 in the source's own order."""
    kind, location = resolve_source(spec, data_root)
    records = _read_hf(str(location)) if kind == "hf" else read_rows(location)
    name = spec if kind == "named" else (f"hf:{location}" if kind == "hf" else Path(location).stem)
    rows, invalid = [], []
    for number, record in enumerate(records):
        if limit is not None and number >= limit:
            break
        problem = get_field(record, problem_field) if problem_field else _first_field(record, PROBLEM_FIELDS)
        answer = get_field(record, answer_field) if answer_field else _first_field(record, ANSWER_FIELDS)
        steps = None
        if isinstance(answer, str) and "####" in answer:
            answer, steps = gsm8k_final_answer(answer), solution_steps(answer)
        problem = "" if problem is None else str(problem)
        answer = "" if answer is None else str(answer)
        missing = [
            (f, flag, named or " / ".join(tried))
            for f, v, flag, named, tried in (
                ("problem", problem, "--problem-field", problem_field, PROBLEM_FIELDS),
                ("answer", answer, "--answer-field", answer_field, ANSWER_FIELDS),
            )
            if not v.strip()
        ]
        if missing:
            detail = "; ".join(f"no usable {what} in field {fields}" for what, _, fields in missing)
            keys = sorted(record) if isinstance(record, dict) else type(record).__name__
            invalid.append(
                {
                    "source": name,
                    "row": number,
                    "keys": keys,
                    "reason": f"missing_{'_and_'.join(m[0] for m in missing)}: {detail}; the row has keys "
                    f"{keys} (pass {' and '.join(m[1] for m in missing)} to name the right one)",
                }
            )
            continue
        rows.append(
            {
                "id": f"{name}:{number}",
                "source": name,
                "row": number,
                "problem": problem,
                "answer": answer,
                "solution_steps": steps,
            }
        )
    return rows, invalid


def load_eval_set(
    name: str, eval_dir: Path | None = None, data_root: Path | None = None
) -> list[dict[str, Any]]:
    """Problems of one evaluation set: the installed `eval` package's data, else --eval-dir, else the raw
    data."""
    candidates: list[Path] = []
    if name in BENCHMARKS:
        try:
            candidates.append(benchmark_path(name))
        except ModuleNotFoundError:  # the `eval` package, which ships them, is not installed
            pass
    if eval_dir is not None:
        candidates += [Path(eval_dir) / f"{name}.jsonl", Path(eval_dir) / name / "test.jsonl"]
    if name in _EVAL_RAW:
        candidates.append((Path(data_root) if data_root else default_data_root()) / _EVAL_RAW[name])
    for path in candidates:
        if path.is_file():
            return [
                {
                    "id": str(r.get("id", r.get("unique_id", i))),
                    "problem": str(_first_field(r, PROBLEM_FIELDS) or ""),
                }
                for i, r in enumerate(read_rows(path))
            ]
    raise SourceError(
        f"--decontaminate {name}: evaluation set not found (looked in {', '.join(map(str, candidates))}). "
        f"Install the `eval` package data, or pass --eval-dir DIR holding {name}.jsonl."
    )
