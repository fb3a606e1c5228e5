"""Held-out accuracy during training: avg@n over a problem list with the rollout engine already loaded.

The full evaluator (benchmarks, pass@k, maj@k, resumable generations, reports) is `dapo-suite eval`; this is
the small in-loop measurement the trainer reports before and after training.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from tqdm.auto import tqdm

from dapo_suite.core.reward import compute_score, extract_answer
from dapo_suite.core.stats import avg_at_k, avg_at_k_standard_error, mean_pass_at_k
from dapo_suite.inference.engines import Completion, Engine, Request, Sampling

if TYPE_CHECKING:
    from dapo_suite.train.config import TrainConfig


def heldout_accuracy(
    engine: Engine,
    prompts: list[str],
    answers: list[str],
    n: int,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    seed: int = 0,
) -> dict[str, float]:
    """avg@n (mean correctness over all samples), its standard error over problems, pass@n (a problem counts
    when any of its n samples is right: what exploration buys), and length statistics.

    Sampling uses its own generator seeded with `seed`: the same model gives the same measurement, and
    measuring does not move the training run's random stream."""
    start = time.monotonic()
    # Generate in the engine's own batch size (whole groups), so the progress bar moves without smaller
    # batches; each part's generator is seeded from `seed` and its first problem.
    chunk = max(1, getattr(engine, "batch_size", len(prompts) * n) // n)
    completions: list[Completion] = []
    correct: list[list[bool]] = [[] for _ in prompts]
    with tqdm(total=len(prompts) * n, desc="held-out eval", unit="sample", leave=False) as bar:
        for first in range(0, len(prompts), chunk):
            requests = [
                Request(str(problem), index, prompts[problem])
                for problem in range(first, min(first + chunk, len(prompts)))
                for index in range(n)
            ]
            part: list[Completion] = []
            engine.generate(
                requests,
                Sampling(temperature, top_p, max_new_tokens, chat_template=False, seed=seed + first),
                part.append,
            )
            for completion in part:
                problem = int(completion.problem_id)
                correct[problem].append(
                    bool(compute_score("heldout", completion.graded_text, answers[problem])["acc"])
                )
            completions += part
            bar.update(len(part))
    return {
        "acc": avg_at_k(correct),
        "acc_stderr": avg_at_k_standard_error(correct),
        f"pass_at_{n}": mean_pass_at_k(correct, n),
        "format_rate": sum(extract_answer(c.graded_text) is not None for c in completions) / len(completions),
        "response_len_mean": sum(c.model_tokens for c in completions) / len(completions),
        "truncated": sum(c.finish_reason == "length" for c in completions) / len(completions),
        "problems": len(correct),
        "samples_per_problem": n,
        "seconds": time.monotonic() - start,
        **(
            {
                "tool_call_rate": sum(bool(c.tool_calls) for c in completions) / len(completions),
                "tool_calls_per_response": sum(len(c.tool_calls) for c in completions) / len(completions),
            }
            if any(c.tool_calls for c in completions)
            else {}
        ),
    }


def heldout_accuracy_of(
    engine: Engine, prompts: list[str], answers: list[str], config: TrainConfig
) -> dict[str, float]:
    """`heldout_accuracy` with a training config's held-out settings (val_n, val_temperature, val_top_p, the
    evaluation length and the run's seed): the one measurement every trainer here reports."""
    return heldout_accuracy(
        engine,
        prompts,
        answers,
        n=config.val_n,
        max_new_tokens=config.eval_max_tokens,
        temperature=config.val_temperature,
        top_p=config.val_top_p,
        seed=config.seed,
    )
