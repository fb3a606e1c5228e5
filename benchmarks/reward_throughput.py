"""Reward throughput: dapo-suite's compute_score against verl's math_dapo and math-verify, in one run.

    .venv/bin/python benchmarks/reward_throughput.py [--count 100000] [--math-verify-count 1000]

Scores the same realistic responses (short and long chains of thought, `Answer:` lines written many ways,
boxed answers, hedges, truncations, malformed text; integer ground truths) with each scorer on one core, prints
responses/s and the ratios, and checks that the verdicts are identical wherever verl is right (the target:
at least 2x verl's math_dapo on this integer path). math-verify parses the whole response and is far slower, so
it scores the first --math-verify-count responses; its rate is per response like the others.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.synthetic_responses import make_responses  # noqa: E402
from dapo_suite.core.provenance import cpu_line  # noqa: E402
from dapo_suite.core.reward import compute_score  # noqa: E402


def rate(label: str, scorer, pairs) -> tuple[float, list[bool]]:
    start = time.perf_counter()
    verdicts = [scorer(text, truth) for text, truth in pairs]
    seconds = time.perf_counter() - start
    per_second = len(pairs) / seconds
    print(f"{label:<28} {len(pairs):>7} responses in {seconds:7.2f} s = {per_second:>10,.0f} responses/s")
    return per_second, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=100_000)
    parser.add_argument("--math-verify-count", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from math_verify import parse, verify
    from verl.utils.reward_score.math_dapo import compute_score as verl_math_dapo

    logging.disable(logging.WARNING)
    print(cpu_line())
    pairs = make_responses(args.count, seed=args.seed)
    mean_chars = sum(len(text) for text, _ in pairs) / len(pairs)
    print(f"{len(pairs):,} responses, mean {mean_chars:,.0f} characters, integer ground truths\n")

    ours, our_verdicts = rate("dapo_suite compute_score", lambda t, g: compute_score("math_dapo", t, g)["acc"], pairs)
    verl, verl_verdicts = rate("verl math_dapo", lambda t, g: verl_math_dapo(t, g)["acc"], pairs)
    subset = pairs[: args.math_verify_count]
    math_verify, _ = rate("math-verify parse+verify", lambda t, g: verify(parse(g), parse(t)), subset)

    verl_right = sum(verl_verdicts)
    missed = sum(1 for v, o in zip(verl_verdicts, our_verdicts, strict=True) if v and not o)
    extra = sum(1 for v, o in zip(verl_verdicts, our_verdicts, strict=True) if o and not v)
    print(f"\nratio vs verl math_dapo: {ours / verl:.2f}x   (target >= 2x)")
    print(f"ratio vs math-verify:    {ours / math_verify:.1f}x")
    print(f"accuracy: dapo_suite {sum(our_verdicts) / len(pairs):.3f}, verl {verl_right / len(pairs):.3f}")
    print(f"verdicts where verl is right: {verl_right:,}, of which dapo_suite disagrees on {missed} "
          f"(must be 0); dapo_suite right where verl is not: {extra:,} (042, 42.0, **42**, units)")
    print(cpu_line())  # the load while it ran: both checkers share it
    if missed:
        raise SystemExit("verdicts differ where verl is right")


if __name__ == "__main__":
    main()
