"""Training problems: the built-in arithmetic curriculum, or any file in the DAPO/verl format.

A problem is `(id, problem text, integer answer as a string)`; the trainer wraps the text in the DAPO prompt.
The built-in task exists so the embedded 135M model can learn on a CPU: its difficulty mix is chosen so that the
model solves some problems but not all (measured: about 2-5 % of samples right at the start, mostly because it
rarely ends with an `Answer:` line), which is what gives dynamic sampling mixed groups to learn from.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Problem:
    id: str
    problem: str
    answer: str


def arithmetic_problem(rng: random.Random) -> Problem:
    """One problem of the curriculum: single-digit sums (easy) to two-digit sums and small products."""
    level = rng.choices(["add1", "add2", "sub", "mul"], weights=[4, 3, 2, 1])[0]
    if level == "add1":
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        text, value = f"What is {a} + {b}?", a + b
    elif level == "add2":
        a, b = rng.randint(10, 40), rng.randint(1, 9)
        text, value = f"What is {a} + {b}?", a + b
    elif level == "sub":
        a, b = rng.randint(5, 20), rng.randint(1, 5)
        text, value = f"What is {a} - {b}?", a - b
    else:
        a, b = rng.randint(2, 9), rng.randint(2, 5)
        text, value = f"What is {a} times {b}?", a * b
    return Problem(id=f"{level}:{text}", problem=text, answer=str(value))


def arithmetic_split(count: int, seed: int, exclude: set[str] = frozenset()) -> list[Problem]:
    """`count` distinct problems not in `exclude` (ids), deterministic for the seed."""
    rng = random.Random(seed)
    problems: dict[str, Problem] = {}
    attempts = 0
    while len(problems) < count:
        attempts += 1
        if attempts > 100 * count:
            raise ValueError(f"the arithmetic task has fewer than {count} distinct problems left")
        problem = arithmetic_problem(rng)
        if problem.id not in exclude:
            problems.setdefault(problem.id, problem)
    return list(problems.values())


def builtin_task(name: str, heldout_size: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) for a built-in task; the held-out problems never appear in training."""
    if name != "arithmetic":
        raise ValueError(f"unknown task {name!r}: the built-in task is 'arithmetic' (or pass --train-file)")
    heldout = arithmetic_split(heldout_size, seed=10_000 + seed)
    train = arithmetic_split(400, seed=seed, exclude={p.id for p in heldout})
    return train, heldout


def load_problems(path: str | Path) -> list[Problem]:
    """Problems from a verl/DAPO parquet (`prompt`, `reward_model.ground_truth`) or a jsonl/parquet with
    `problem`/`question` and `answer` columns. Errors name the file, row and missing field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"training data {path} does not exist")
    if path.suffix == ".parquet":
        import pandas as pd

        rows = pd.read_parquet(path).to_dict("records")
    elif path.suffix in (".jsonl", ".json"):
        with path.open() as handle:
            rows = [json.loads(line) for line in handle if line.strip()]
    else:
        raise ValueError(f"{path}: expected .parquet or .jsonl")
    problems = []
    for number, row in enumerate(rows):
        problem, answer = _problem_text(row), _answer(row)
        if not problem or answer in (None, ""):
            raise ValueError(f"{path} row {number}: needs a problem (prompt/problem/question) and an answer "
                             "(reward_model.ground_truth/answer)")
        row_id = str((row.get("extra_info") or {}).get("index", number)) if isinstance(row.get("extra_info"), dict) else str(number)
        problems.append(Problem(id=row_id, problem=problem, answer=str(answer)))
    return problems


def _problem_text(row: dict) -> str | None:
    from dapo_suite.prompts import strip_template

    if "prompt" in row and row["prompt"] is not None and len(row["prompt"]):
        content = list(row["prompt"])[-1]["content"]
        return strip_template(content)
    return row.get("problem") or row.get("question")


def _answer(row: dict) -> str | None:
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") not in (None, ""):
        return str(reward_model["ground_truth"])
    return row.get("answer")
