"""Realistic model responses with known integer ground truths, for the reward benchmark and its tests.

Mixes what RL rollouts look like: short and long chains of thought, DAPO-format `Answer:` lines written many
ways, `\\boxed{}` answers, wrong answers, hedges, truncated responses with no answer, and malformed text.
Deterministic for a seed.
"""

from __future__ import annotations

import random

FILLER = (
    "Let me think about this step by step. We compute the sum of the terms and simplify. "
    "Wait, let me re-check the second case: the factor of $2$ cancels, so the expression becomes "
    "$\\frac{{{a}}}{{{b}}}$ and the remaining terms give ${c}$. "
)

ANSWER_FORMS = [
    "Answer: {v}",
    "Answer: ${v}$",
    "Answer: $\\boxed{{{v}}}$",
    "Answer: \\boxed{{{v}}}",
    "answer: {v}",
    "Answer:{v}",
    "Answer: {v}.",
    "Answer: x = {v}",
    "Answer: **{v}**",
    "Answer: {v} dollars",
    "Answer: {v}\\text{{ cm}}",
    "Answer: ${v}^\\circ$",
    "Answer: {v}.0",
    "Answer: 0{v}",
    "Answer: The answer is ${v}$.",
    "Answer: $n = {v}$",
    "Answer: {v} ways",
    "Answer: \\text{{{v}}}",
]
BOXED_FORMS = ["The final answer is $\\boxed{{{v}}}$.", "Therefore $\\boxed{{{v}}}$", "\\boxed{{{v}}}"]
MALFORMED = [
    "Answer: {v} or {w}",
    "Answer: ",
    "I don't know.",
    "Answer: \\boxed{{{v}",
    "Answer: {v}x",
    "Answer: \\frac{{{v}}}{{2}}",
    "Answer: 9^9^9^9",
    "\x00\x00Answer:\x00{v}",
    "Answer: \ud800{v}",
    "}" * 50 + "{" * 50,
]


def make_responses(count: int, seed: int = 0) -> list[tuple[str, str]]:
    """`count` (response, integer ground truth) pairs: about 40 % correct, 15 % boxed, 15 % malformed."""
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        truth = rng.choice([rng.randint(0, 999), rng.randint(1000, 99999), -rng.randint(1, 99)])
        value = truth if rng.random() < 0.5 else truth + rng.choice([-1, 1, 10, 100])
        steps = rng.choice([1, 3, 10, 40])  # short to long chains of thought (~150 to ~6,000 characters)
        body = "".join(
            FILLER.format(a=rng.randint(1, 99), b=rng.randint(2, 99), c=rng.randint(0, 999))
            for _ in range(steps)
        )
        kind = rng.random()
        if kind < 0.70:
            ending = rng.choice(ANSWER_FORMS).format(v=value)
        elif kind < 0.85:
            ending = rng.choice(BOXED_FORMS).format(v=value)
        else:
            ending = rng.choice(MALFORMED).format(v=value, w=value + 1)
        if rng.random() < 0.05:  # truncated mid-thought: no answer at all
            ending = ""
        pairs.append((body + "\n\n" + ending, str(truth)))
    return pairs
