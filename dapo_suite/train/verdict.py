"""Did a run learn? The verdict `dapo-suite train` and the demo print at the end, with the measured reason.

A run learned when held-out accuracy rose by more than twice the standard error of the difference
(z = (after - before) / sqrt(se_before^2 + se_after^2) >= 2; the same avg@k standard errors as the report's
intervals). When it did not, the reason comes from metrics.jsonl: steps that made no update (dynamic sampling
found no group with both right and wrong answers, eq. 11 of arXiv 2503.14476), steps that trained on fewer
groups than asked, and the answer-format rate, each with what to change.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_LEARNED = 2.0  # ~95 % one-sided: a rise smaller than this is within the noise of a 63-problem avg@2


@dataclass(frozen=True)
class Verdict:
    learned: bool
    headline: str  # one line: learned / did not learn, with the held-out change
    reason: str  # the measured cause when it did not learn (empty when it did)
    advice: str  # what to try (empty when it learned)

    def text(self) -> str:
        return "\n".join(part for part in (self.headline, self.reason, self.advice) if part)


def learning_verdict(before: dict, after: dict, steps: list[dict], train_batch_size: int) -> Verdict:
    """The verdict from held-out accuracy before and after (`acc`, `acc_stderr`) and the per-step metrics."""
    change = after["acc"] - before["acc"]
    noise = math.hypot(before.get("acc_stderr", 0.0), after.get("acc_stderr", 0.0))
    z = change / noise if noise > 0 else (math.inf if change > 0 else 0.0)
    summary = (
        f"held-out {100 * before['acc']:.1f} % -> {100 * after['acc']:.1f} % ({100 * change:+.1f} "
        f"points, z {z:.1f})"
    )
    if z >= Z_LEARNED:
        return Verdict(True, f"verdict: learned: {summary}", "", "")
    trained = [step for step in steps if "sampling/groups_kept" in step]
    no_update = sum(step["sampling/groups_kept"] == 0 for step in trained)
    short = sum(0 < step["sampling/groups_kept"] < train_batch_size for step in trained)
    formats = [step["reward/format_rate"] for step in trained if "reward/format_rate" in step]
    accuracy = [step["reward/acc"] for step in trained if "reward/acc" in step]
    causes, advice = [], []
    if trained and no_update + short >= len(trained) / 2:
        causes.append(
            f"no mixed group in {no_update} of {len(trained)} steps, fewer than {train_batch_size} in "
            f"{short} more (train accuracy {100 * min(accuracy, default=0):.1f}-"
            f"{100 * max(accuracy, default=0):.1f} %)"
        )
        advice.append(
            "more chances of a mixed group: --set max_num_gen_batches=8 or group_size=32, or show the "
            "answer format with --set prompt_shots=1"
        )
    if len(formats) >= 2 and formats[-1] < 0.5 * formats[0]:
        causes.append(
            f"the answer-format rate fell from {100 * formats[0]:.1f} % to {100 * formats[-1]:.1f} %"
        )
        advice.append("a lower --set lr, or more steps with mixed groups before the format is lost")
    if not causes:
        causes.append(
            f"updates were made in {len(trained) - no_update} of {len(trained)} steps, but held-out "
            f"accuracy did not move beyond its noise"
        )
        advice.append(
            "more steps (--max-steps), a larger held-out set (--set heldout_size), or a higher --set lr"
        )
    return Verdict(
        False,
        f"verdict: did not learn: {summary}",
        "reason: " + "; ".join(causes),
        "try: " + "; ".join(advice),
    )
