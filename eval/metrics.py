"""Evaluation metrics: pure functions over graded samples, one per metric, each with its formula.

Notation: P problems; problem i has n_i samples, c_i of them correct. avg@k, its standard error and interval,
pass@k, and the tests across seeds are shared with the trainer and the report, so they live in
`dapo_suite.core.stats`.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence

from dapo_suite.core.reward import parse_integer


def k_values(n: int) -> list[int]:
    """The k reported for pass@k and maj@k: 1, 2, 4, ... up to n, and n itself."""
    ks = [2**j for j in range(n.bit_length()) if 2**j <= n]
    return ks if ks[-1] == n else ks + [n]


def answer_key(pred: str) -> str:
    """What majority voting counts as one answer: the integer an answer states, else the answer with its
    whitespace removed (so `042`, `42.0`, `$42$` vote together)."""
    value = parse_integer(pred)
    return str(value) if value is not None else "".join(pred.split())


def majority_correct(preds: Sequence[str | None], correct: Sequence[bool]) -> bool:
    """Majority vote over extracted answers (None = no answer, not a vote); ties go to the answer seen first.
    The vote is correct when the samples giving the winning answer were graded correct. False with no
    votes."""
    keys = [answer_key(p) if p is not None else None for p in preds]
    votes = Counter(k for k in keys if k is not None)
    if not votes:
        return False
    top = max(votes.values())
    winner = next(k for k in keys if k is not None and votes[k] == top)
    return correct[keys.index(winner)]


def maj_at_k(preds: Sequence[Sequence[str | None]], correct: Sequence[Sequence[bool]], k: int) -> float:
    """maj@k = (1/P) sum_i [majority answer of the first k samples of problem i is correct]."""
    return sum(majority_correct(p[:k], c[:k]) for p, c in zip(preds, correct, strict=True)) / len(preds)


def format_failure_rate(preds: Sequence[str | None]) -> float:
    """Fraction of samples with no extractable answer (pred is None: no `Answer:` line and no \\boxed{})."""
    return sum(p is None for p in preds) / len(preds)


def truncated_fraction(finish_reasons: Sequence[str]) -> float:
    """Fraction of samples stopped by the token budget (finish reason `length`)."""
    return sum(r == "length" for r in finish_reasons) / len(finish_reasons)


def length_statistics(num_tokens: Sequence[int]) -> dict[str, float]:
    """Response length in tokens: mean, population std, min, median, 90th percentile (nearest rank), max."""
    ordered = sorted(num_tokens)
    p90 = ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)]
    return {
        "mean": statistics.fmean(ordered),
        "std": statistics.pstdev(ordered),
        "min": ordered[0],
        "median": statistics.median(ordered),
        "p90": p90,
        "max": ordered[-1],
    }


def tokens_per_second(num_tokens: int, wall_seconds: float) -> float:
    """Generated tokens / wall-clock seconds of generation."""
    return num_tokens / wall_seconds if wall_seconds > 0 else math.nan
