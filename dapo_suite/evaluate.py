"""Held-out accuracy during training: avg@n over a problem list with the rollout engine already loaded.

The full evaluator (benchmarks, pass@k, maj@k, resumable generations, reports) is `dapo-suite eval`; this is
the small in-loop measurement the trainer reports before and after training.
"""

from __future__ import annotations

import time

from dapo_suite.reward import compute_score, extract_answer


def heldout_accuracy(engine, prompts: list[str], answers: list[str], n: int, max_new_tokens: int,
                     temperature: float, top_p: float, seed: int = 0) -> dict[str, float]:
    """avg@n (mean correctness over all samples), its standard error over problems, and length statistics.

    Sampling uses its own generator seeded with `seed`: the same model gives the same measurement, and
    measuring does not move the training run's random stream."""
    start = time.monotonic()
    rollouts = engine.generate(prompts, n, max_new_tokens, temperature, top_p, seed=seed)
    per_problem = [0.0] * len(prompts)
    for rollout in rollouts:
        per_problem[rollout.group] += compute_score("heldout", rollout.text, answers[rollout.group])["acc"] / n
    count = len(per_problem)
    mean = sum(per_problem) / count
    variance = sum((p - mean) ** 2 for p in per_problem) / max(count - 1, 1)
    return {
        "acc": mean,
        "acc_stderr": (variance / count) ** 0.5,
        "format_rate": sum(extract_answer(r.text) is not None for r in rollouts) / len(rollouts),
        "response_len_mean": sum(r.length for r in rollouts) / len(rollouts),
        "truncated": sum(r.truncated for r in rollouts) / len(rollouts),
        "problems": count,
        "samples_per_problem": n,
        "seconds": time.monotonic() - start,
    }
