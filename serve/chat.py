"""What the chat shows, as pure functions over text (no Gradio, no network): the reply split into its
reasoning and its final `Answer:` line, the answer read as the reward reads it (`dapo_suite.core.reward`), a
check against the benchmark's answer when the question is a known AIME 2024 problem, and the per-reply speed
figures."""

from __future__ import annotations

import re
from dataclasses import dataclass

from dapo_suite.core.problems import Problem, benchmark_path, read_rows
from dapo_suite.core.reward import answer_mark, compute_score, extract_answer, parse_integer

_SPACE = re.compile(r"\s+")


def load_examples(name: str = "aime24") -> list[Problem]:
    """AIME 2024 from the evaluator's package data; [] (no examples, no checks) when it is not installed."""
    try:
        rows = read_rows(benchmark_path(name))
    except (ValueError, ModuleNotFoundError, OSError):  # not a shipped benchmark, or `eval` not installed
        return []
    return [Problem(str(row["id"]), row["problem"], str(row["answer"])) for row in rows]


def normalise(text: str) -> str:
    """Whitespace-insensitive key, so a pasted problem with other line breaks still matches."""
    return _SPACE.sub(" ", text).strip()


def find_problem(question: str, problems: list[Problem]) -> Problem | None:
    key = normalise(question)
    return next((problem for problem in problems if normalise(problem.problem) == key), None)


@dataclass(frozen=True)
class Reply:
    thinking: str  # everything before the final answer line
    answer: str | None  # what the reward reads as the answer (`Answer:` line, else last \boxed{}), or None
    integer: int | None  # the answer as an integer, when it states one


def split_reply(text: str) -> Reply:
    """Split a (possibly partial) reply at the `Answer:` the reward reads (the last one in its window); a
    `\\boxed{}` answer stays inside the reasoning, where the model wrote it."""
    answer, mark = extract_answer(text), answer_mark(text)
    thinking = text if mark is None else text[:mark].rstrip().removesuffix("**").rstrip()
    return Reply(thinking=thinking.strip(), answer=answer, integer=parse_integer(answer) if answer else None)


def check(text: str, problem: Problem) -> bool:
    """Whether the reply is right, graded exactly as DAPO's reward grades it."""
    return bool(compute_score("aime24", text, problem.answer)["acc"])


@dataclass(frozen=True)
class Speed:
    tokens: int
    elapsed_s: float
    first_token_s: float | None

    @property
    def tokens_per_s(self) -> float:
        generating = self.elapsed_s - (self.first_token_s or 0.0)
        return (self.tokens - 1) / generating if self.tokens > 1 and generating > 0 else 0.0

    def __str__(self) -> str:
        first = f", first token {self.first_token_s:.2f} s" if self.first_token_s is not None else ""
        return f"{self.tokens} tokens · {self.tokens_per_s:.1f} tokens/s · {self.elapsed_s:.1f} s{first}"
