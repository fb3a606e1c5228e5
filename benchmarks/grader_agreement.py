"""Grader agreement: this project's checker, verl's math_dapo and math-verify on the same answer-equivalence
cases.

    .venv/bin/python -m benchmarks.grader_agreement [--list]

The cases (`tests/fixtures/grader_agreement.jsonl`, one JSON object per line: id, source, gold, response,
expected, note) are written for this project after the public graders' own test suites (math-verify, Hendrycks
MATH's `is_equiv` tests, PRM800K's grader, lm-eval's minerva_math, Qwen2.5-Math's grader, verl's math_dapo)
and MATH-500's answer forms; each names its source. `expected` is the mathematically right verdict under the
conventions in `dapo_suite/core/reward.py` (a comma list is a set, units and percent signs are presentation);
where a source's own test says otherwise, the note says why. Prints, per grader, agreement with `expected`,
false accepts (the dangerous kind for RL: a reward the policy can learn to collect), false rejects and
timeouts; `--list` prints each disagreement. math-verify is called as a user would:
`verify(parse("$gold$"), parse(response))`.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Callable
from pathlib import Path

from dapo_suite.core.provenance import cpu_line
from dapo_suite.core.reward import compute_score

CASES_FILE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "grader_agreement.jsonl"


def load_cases(path: Path = CASES_FILE) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def dapo_suite_verdict(gold: str, response: str) -> bool | None:
    """True/False, or None when the symbolic checker could not check (a timeout, or past its work bound)."""
    result = compute_score("grader_agreement", response, gold)
    return None if result["timeout"] or result["too_complex"] else result["acc"]


def math_dapo_verdict(gold: str, response: str) -> bool:
    from verl.utils.reward_score.math_dapo import compute_score as math_dapo

    return bool(math_dapo(response, gold)["acc"])


def math_verify_verdict(gold: str, response: str) -> bool:
    from math_verify import parse, verify

    return bool(verify(parse(f"${gold}$"), parse(response)))


GRADERS: dict[str, Callable[[str, str], bool | None]] = {
    "dapo-suite compute_score": dapo_suite_verdict,
    "verl math_dapo": math_dapo_verdict,
    "math-verify 0.9 parse+verify": math_verify_verdict,
}


def grade(cases: list[dict], grader: Callable[[str, str], bool | None]) -> list[bool | None]:
    return [grader(case["gold"], case["response"]) for case in cases]


def tally(cases: list[dict], verdicts: list[bool | None]) -> dict[str, int]:
    expected = [case["expected"] for case in cases]
    pairs = list(zip(expected, verdicts, strict=True))
    return {
        "agree": sum(e == v for e, v in pairs),
        "false_accepts": sum(v is True and not e for e, v in pairs),
        "false_rejects": sum(v is False and e for e, v in pairs),
        "timeouts": sum(v is None for _, v in pairs),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="print every disagreement with its case")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    print(cpu_line())
    cases = load_cases()
    positives = sum(case["expected"] for case in cases)
    sources = sorted({case["source"] for case in cases})
    print(
        f"{len(cases)} cases ({positives} equivalent, {len(cases) - positives} not) from {len(sources)} "
        "sources\n"
    )
    print("| grader | agreement | false accepts | false rejects | timeouts |")
    print("|---|---|---|---|---|")
    for name, grader in GRADERS.items():
        verdicts = grade(cases, grader)
        counts = tally(cases, verdicts)
        print(
            f"| {name} | {counts['agree']}/{len(cases)} ({100 * counts['agree'] / len(cases):.1f} %) | "
            f"{counts['false_accepts']} | {counts['false_rejects']} | {counts['timeouts']} |"
        )
        if args.list:
            for case, verdict in zip(cases, verdicts, strict=True):
                if verdict != case["expected"]:
                    print(
                        f"    {case['id']}: expected {case['expected']}, got {verdict}: gold "
                        f"{case['gold']!r}, response {case['response'][-80:]!r}"
                    )


if __name__ == "__main__":
    main()
