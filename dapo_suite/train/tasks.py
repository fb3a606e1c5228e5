"""Training problems: the built-in arithmetic curriculum, or any file in the DAPO/verl format.

A problem is `(id, problem text, integer answer as a string)`; the trainer wraps the text in the DAPO prompt.
The built-in task exists so the embedded 135M model can learn on a CPU: its difficulty mix is chosen so that
the model solves some problems but not all (few samples are right at the start, mostly because it rarely ends
with an `Answer:` line), which is what gives dynamic sampling mixed groups to learn from.
"""

from __future__ import annotations

import random
from functools import partial
from pathlib import Path

from dapo_suite.core.errors import UserError
from dapo_suite.core.problems import Problem, read_rows
from dapo_suite.train.config import TrainConfig


def arithmetic_problems() -> list[Problem]:
    """Every problem of the curriculum (292): single-digit sums, teen plus one-digit sums, small differences
    and small products. Larger numbers leave the 135M model almost never right, so no group is mixed."""
    problems = [(f"What is {a} + {b}?", a + b, "add1") for a in range(1, 10) for b in range(1, 10)]
    problems += [(f"What is {a} + {b}?", a + b, "add2") for a in range(10, 21) for b in range(1, 10)]
    problems += [(f"What is {a} - {b}?", a - b, "sub") for a in range(5, 21) for b in range(1, 6)]
    problems += [(f"What is {a} times {b}?", a * b, "mul") for a in range(2, 10) for b in range(2, 6)]
    return [Problem(id=f"{level}:{text}", problem=text, answer=str(value)) for text, value, level in problems]


def arithmetic_in_words() -> list[Problem]:
    """The curriculum's operations with the operator in words ("What is 3 plus 4?", "minus", "multiplied by";
    292 problems): the same skills, none of the same problem texts. A run can learn the answer format here and
    be measured on the curriculum's held-out split (the entropy comparison's warm start,
    docs/results/entropy/)."""
    words = {"+": "plus", "-": "minus", "times": "multiplied by"}
    problems = []
    for problem in arithmetic_problems():
        text = problem.problem
        for symbol, word in words.items():
            text = text.replace(f" {symbol} ", f" {word} ")
        problems.append(Problem(id=f"words:{text}", problem=text, answer=problem.answer))
    return problems


# The word problems' story parts: a person, a countable thing, and one sentence per operation.
STORY_PEOPLE = (("Tom", "he"), ("Anna", "she"), ("Sam", "he"), ("Mia", "she"), ("Leo", "he"), ("Zoe", "she"))
STORY_THINGS = ("apples", "marbles", "stickers", "books", "coins", "pencils")
STORY_GAINS = ("{Pron} gets {n} more.", "{Pron} buys {n} more.", "{Pron} finds {n} more.")
STORY_LOSSES = ("{Pron} gives away {n}.", "{Pron} loses {n}.", "{Pron} sells {n}.")
WORD_PROBLEMS_PER_LEVEL = 400
WORD_PROBLEM_MAX_NUMBER = 12


def word_problems(
    operations: int,
    count: int = WORD_PROBLEMS_PER_LEVEL,
    max_number: int = WORD_PROBLEM_MAX_NUMBER,
    seed: int = 0,
    min_number: int = 1,
) -> list[Problem]:
    """`count` distinct stories of `operations` gains and losses on a starting amount ("Tom has 7 apples. He
    gets 5 more. He gives away 3. How many apples does Tom have now?"), every number in min_number..max_number
    and every running total non-negative. The knob is `operations`: each adds a step the model must carry, so
    the untrained model's accuracy falls with it and writing the steps out (longer responses) starts to
    pay."""
    label = f"word-problems-{operations}-{seed}" + (f"-{min_number}-{max_number}" if min_number > 1 else "")
    rng, problems, seen = random.Random(label), [], set()
    while len(problems) < count:
        (name, pronoun), thing = rng.choice(STORY_PEOPLE), rng.choice(STORY_THINGS)
        total = rng.randint(max(2, min_number), max_number)
        sentences = [f"{name} has {total} {thing}."]
        for _ in range(operations):
            gain = total < min_number or rng.random() < 0.5
            amount = rng.randint(min_number, max_number if gain else min(total, max_number))
            total += amount if gain else -amount
            sentences.append(
                rng.choice(STORY_GAINS if gain else STORY_LOSSES).format(Pron=pronoun.capitalize(), n=amount)
            )
        text = " ".join([*sentences, f"How many {thing} does {name} have now?"])
        if text not in seen:
            seen.add(text)
            kind = f"word{operations}" + (f"-{min_number}-{max_number}" if min_number > 1 else "")
            problems.append(Problem(id=f"{kind}:{len(problems)}", problem=text, answer=str(total)))
    return problems


STORY_CONTAINERS = ("boxes", "bags", "rows", "shelves", "packs", "crates")


def product_problems(count: int, low: int, high: int, seed: int = 0) -> list[Problem]:
    """`count` distinct stories of equal groups ("Tom has 14 boxes. Each box holds 23 apples. How many apples
    does Tom have?"), both factors in low..high: one multiplication the 135M model rarely does in its head."""
    rng, problems, seen = random.Random(f"products-{low}-{high}-{seed}"), [], set()
    while len(problems) < count:
        (name, _), thing, container = (
            rng.choice(STORY_PEOPLE),
            rng.choice(STORY_THINGS),
            rng.choice(STORY_CONTAINERS),
        )
        groups, each = rng.randint(low, high), rng.randint(low, high)
        text = (
            f"{name} has {groups} {container}. Each of them holds {each} {thing}. How many {thing} does "
            f"{name} have?"
        )
        if text not in seen:
            seen.add(text)
            problems.append(Problem(id=f"product:{len(problems)}", problem=text, answer=str(groups * each)))
    return problems


# The tool study's task (docs/results/tools/): small sums the text arm can learn, and three-digit sums and
# two-digit products where computing pays; the mix was chosen by scripts/tools_probe.py on training problems.
TOOL_TASK_PARTS = {
    "small": partial(word_problems, 1, 400),
    "large": partial(word_problems, 1, 400, 999, 0, 100),
    "product": partial(product_problems, 400, 11, 40),
}


def tool_task() -> list[Problem]:
    return [problem for part in TOOL_TASK_PARTS.values() for problem in part()]


BUILTIN_TASKS = {
    "arithmetic": arithmetic_problems,
    "arithmetic-in-words": arithmetic_in_words,
    **{f"word-problems-{steps}": partial(word_problems, steps) for steps in (1, 2, 3, 4)},
    "word-problems-tool": tool_task,
}


def builtin_task(name: str, heldout_size: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out) for a built-in task: a seeded shuffle of all its problems, split; never
    overlapping."""
    if name not in BUILTIN_TASKS:
        raise ValueError(
            f"unknown task {name!r}: the built-in tasks are {', '.join(BUILTIN_TASKS)} (or pass --train-file)"
        )
    problems = BUILTIN_TASKS[name]()
    if not 0 < heldout_size < len(problems):
        raise ValueError(f"heldout_size must be between 1 and {len(problems) - 1} for the {name} task")
    return split_heldout(problems, heldout_size, seed)


def train_and_heldout(config: TrainConfig) -> tuple[list[Problem], list[Problem]]:
    """What a run trains and is held out on: --train-file (held out: --val-file, else a seeded split of it) or
    the built-in task (held out: its seeded split, or --val-file)."""
    if config.train_file:
        train = load_problems(config.train_file)
        heldout = load_problems(config.val_file) if config.val_file else []
        if not heldout:
            train, heldout = split_heldout(train, min(config.heldout_size, len(train) // 5), config.seed)
        return train, heldout
    train, heldout = builtin_task(config.task, config.heldout_size, config.seed)
    if config.val_file:
        heldout = load_problems(config.val_file)
    return train, heldout


def split_heldout(
    problems: list[Problem], heldout_size: int, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """(train, held-out): a seeded shuffle, then the first `heldout_size` held out. Files are often sorted by
    source or difficulty, so a plain cut would not be a fair sample."""
    shuffled = problems.copy()
    random.Random(seed).shuffle(shuffled)
    return shuffled[heldout_size:], shuffled[:heldout_size]


def load_problems(path: str | Path) -> list[Problem]:
    """Problems from a verl/DAPO parquet (`prompt`, `reward_model.ground_truth`) or a jsonl/parquet with
    `problem`/`question` and `answer` columns. Errors name the file, row and missing field."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"training data {path} does not exist; pass a .parquet or .jsonl file, or build one "
            f"with `dapo-suite data build --input SOURCE --out {path.parent}`"
        )
    if path.suffix not in (".parquet", ".jsonl", ".json"):
        raise UserError(f"{path}: expected .parquet or .jsonl")
    rows = read_rows(path)
    where = "row" if path.suffix == ".parquet" else "line"
    problems = []
    for number, row in enumerate(rows, 1):
        if not isinstance(row, dict):
            raise UserError(f"{path} {where} {number}: expected a JSON object, got {type(row).__name__}")
        problem, answer = _problem_text(row), _answer(row)
        if not problem or answer is None or not str(answer).strip():
            raise UserError(
                f"{path} {where} {number}: needs a problem (prompt/problem/question) and an answer "
                f"(reward_model.ground_truth/answer); its fields are {sorted(row)}"
            )
        row_id = (
            str((row.get("extra_info") or {}).get("index", number))
            if isinstance(row.get("extra_info"), dict)
            else str(number)
        )
        problems.append(Problem(id=row_id, problem=problem, answer=str(answer)))
    return problems


def _problem_text(row: dict) -> str | None:
    from dapo_suite.core.prompts import strip_template

    if "prompt" in row and row["prompt"] is not None and len(row["prompt"]):
        content = list(row["prompt"])[-1]["content"]
        return strip_template(content)
    return row.get("problem") or row.get("question")


def _answer(row: dict) -> str | None:
    reward_model = row.get("reward_model")
    if isinstance(reward_model, dict) and reward_model.get("ground_truth") not in (None, ""):
        return str(reward_model["ground_truth"])
    return row.get("answer")
