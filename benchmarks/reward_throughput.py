"""Reward throughput: dapo-suite's compute_score against verl's math_dapo and math-verify, in one run.

    .venv/bin/python -m benchmarks.reward_throughput [--count 100000] [--math-verify-count 1000] [--repeats 5]

Scores the same realistic responses (short and long chains of thought, `Answer:` lines written many ways,
boxed answers, hedges, truncations, malformed text; integer ground truths) with each scorer on one core,
prints responses/s and the ratios, and checks that the verdicts are identical wherever verl is right (the
target: at least 2x verl's math_dapo on this integer path). math-verify parses the whole response and is far
slower, so it scores the first --math-verify-count responses; its rate is per response like the others.

Each scorer first scores the first 1,000 responses untimed (math-verify a fiftieth of its count: imports,
compiled patterns, caches), then the timing is repeated --repeats times, the scorers taking turns in each
repeat and the order alternating between repeats, so a change in the machine's load reaches all of them alike.
Each repeat is printed; then per scorer the median time (its responses/s is the count over that time) and the
range of responses/s over the repeats, and each ratio as the ratio of the median rates with its range over the
repeats (each repeat's rates divided). Nothing pins it: `taskset -c N` in front keeps it on one core of a
quiet machine.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import statistics
import sys
import time

from benchmarks.synthetic_responses import make_responses
from dapo_suite.core.provenance import cpu_line
from dapo_suite.core.reward import compute_score

# responses each scorer scores untimed before the first repeat (math-verify: a fiftieth of its count)
WARM_UP = 1_000


def timed(scorer, pairs) -> tuple[float, list[bool]]:
    """Seconds to score `pairs` once, and the verdicts."""
    start = time.perf_counter()
    verdicts = [scorer(text, truth) for text, truth in pairs]
    return time.perf_counter() - start, verdicts


def summary(label: str, count: int, seconds: list[float]) -> float:
    """Print the scorer's median time and the range of its rate over the repeats; return the median rate (the
    count over the median time)."""
    median = statistics.median(seconds)
    per_second = count / median
    print(
        f"{label:<28} {count:>7} responses in {median:7.3f} s = {per_second:>10,.0f} responses/s (median of "
        f"{len(seconds)}; range {count / max(seconds):,.0f}-{count / min(seconds):,.0f} responses/s, "
        f"{min(seconds):.3f}-{max(seconds):.3f} s)"
    )
    return per_second


def ratio_line(
    label: str,
    ours: float,
    theirs: float,
    ours_s: list[float],
    theirs_s: list[float],
    digits: int,
    target: str = "",
) -> None:
    """The ratio of the median rates, and its range over the repeats (each repeat's rates divided)."""
    per_repeat = sorted(t / o for o, t in zip(ours_s, theirs_s, strict=True))
    print(
        f"{label:<24} {ours / theirs:.{digits}f}x (repeats "
        f"{per_repeat[0]:.{digits}f}-{per_repeat[-1]:.{digits}f}x){f'   (target {target})' if target else ''}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--count", type=int, default=100_000, help="synthetic responses dapo-suite and verl score"
    )
    parser.add_argument(
        "--math-verify-count",
        type=int,
        default=1_000,
        help="of those, the first this many math-verify scores (it is the slow one: lower this for a "
        "quick run)",
    )
    parser.add_argument("--seed", type=int, default=0, help="the seed the responses are drawn with")
    parser.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timings of each scorer, in turns; the median and the range (min-max) are printed",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: at least 1")

    from math_verify import parse, verify
    from verl.utils.reward_score.math_dapo import compute_score as verl_math_dapo

    logging.disable(logging.WARNING)
    print(cpu_line())
    print(f"command: {shlex.join(getattr(sys, 'orig_argv', [sys.executable, *sys.argv]))}")
    pairs = make_responses(args.count, seed=args.seed)
    mean_chars = sum(len(text) for text, _ in pairs) / len(pairs)
    print(f"{len(pairs):,} responses, mean {mean_chars:,.0f} characters, integer ground truths\n")

    subset = pairs[: args.math_verify_count]
    scorers = {
        "dapo_suite compute_score": (lambda t, g: compute_score("math_dapo", t, g)["acc"], pairs),
        "verl math_dapo": (lambda t, g: verl_math_dapo(t, g)["acc"], pairs),
        "math-verify parse+verify": (lambda t, g: verify(parse(g), parse(t)), subset),
    }
    for scorer, scored in scorers.values():
        timed(scorer, scored[: WARM_UP if scored is pairs else max(1, len(scored) // 50)])
    seconds: dict[str, list[float]] = {label: [] for label in scorers}
    verdicts: dict[str, list[bool]] = {}
    for repeat in range(args.repeats):
        order = list(scorers) if repeat % 2 == 0 else list(scorers)[::-1]
        for label in order:
            scorer, scored = scorers[label]
            took, verdicts[label] = timed(scorer, scored)
            seconds[label].append(took)
        print(
            f"  repeat {repeat + 1}/{args.repeats}: "
            + ", ".join(
                f"{label} {seconds[label][-1]:.4f} s = {len(scorers[label][1]) / seconds[label][-1]:,.0f}/s"
                for label in scorers
            ),
            flush=True,
        )
    print()
    ours = summary("dapo_suite compute_score", len(pairs), seconds["dapo_suite compute_score"])
    verl = summary("verl math_dapo", len(pairs), seconds["verl math_dapo"])
    math_verify = summary("math-verify parse+verify", len(subset), seconds["math-verify parse+verify"])
    our_verdicts, verl_verdicts = verdicts["dapo_suite compute_score"], verdicts["verl math_dapo"]

    verl_right = sum(verl_verdicts)
    missed = sum(1 for v, o in zip(verl_verdicts, our_verdicts, strict=True) if v and not o)
    extra = sum(1 for v, o in zip(verl_verdicts, our_verdicts, strict=True) if o and not v)
    print()
    ratio_line(
        "ratio vs verl math_dapo:",
        ours,
        verl,
        seconds["dapo_suite compute_score"],
        seconds["verl math_dapo"],
        2,
        ">= 2x",
    )
    # math-verify scores the first --math-verify-count only: its times are per response, over its own count
    ratio_line(
        "ratio vs math-verify:",
        ours,
        math_verify,
        [s / len(pairs) for s in seconds["dapo_suite compute_score"]],
        [s / len(subset) for s in seconds["math-verify parse+verify"]],
        1,
    )
    print(f"accuracy: dapo_suite {sum(our_verdicts) / len(pairs):.3f}, verl {verl_right / len(pairs):.3f}")
    print(
        f"verdicts where verl is right: {verl_right:,}, of which dapo_suite disagrees on {missed} "
        f"(must be 0); dapo_suite right where verl is not: {extra:,} (042, 42.0, **42**, units)"
    )
    print(cpu_line())  # the load while it ran: both checkers share it
    if missed:
        raise SystemExit("verdicts differ where verl is right")


if __name__ == "__main__":
    main()
