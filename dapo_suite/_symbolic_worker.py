"""Child process of `reward.SymbolicChecker`: compares (gold, pred) LaTeX pairs with math-verify, forever.

Protocol: one JSON array `[gold, pred]` per line on stdin, one line `true`/`false` per pair on stdout
(`ready` first). Runs in its own process so that the parent can kill it at a hard time limit. It parses with
math-verify's LaTeX grammar only: the plain-expression extractor goes through sympy's `parse_expr`, which
calls `eval` on its input.
"""

from __future__ import annotations

import json
import logging
import resource
import sys

MEMORY_LIMIT_BYTES = 4 * 1024**3  # a runaway expression is stopped here before it can swap the machine


def as_math(answer: str) -> str:
    """Wrap a bare answer so the LaTeX extractor sees it as one math span."""
    return answer if "\\boxed" in answer else f"\\boxed{{{answer}}}"


def distinct_rationals(gold: object, pred: object) -> bool:
    """True for two exact rationals that differ: math-verify compares numerically, so 1/2004! equals 1/2006!."""
    from sympy import Basic, Rational

    if not (isinstance(gold, Basic) and isinstance(pred, Basic)) or gold.free_symbols or pred.free_symbols:
        return False
    gold, pred = gold.doit(), pred.doit()
    return isinstance(gold, Rational) and isinstance(pred, Rational) and gold != pred


def main() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT_BYTES, MEMORY_LIMIT_BYTES))
    logging.disable(logging.CRITICAL)  # math-verify logs a warning when its own (signal) timeout is off
    from math_verify import LatexExtractionConfig, parse, verify

    latex_only = [LatexExtractionConfig(boxed_match_priority=0)]

    def equivalent(gold: str, pred: str) -> bool:
        gold_parsed = parse(as_math(gold), extraction_config=latex_only, parsing_timeout=None)
        pred_parsed = parse(as_math(pred), extraction_config=latex_only, parsing_timeout=None)
        if not gold_parsed or not pred_parsed:
            return False
        if not verify(gold_parsed, pred_parsed, timeout_seconds=None):
            return False
        return not distinct_rationals(gold_parsed[0], pred_parsed[0])

    print("ready", flush=True)
    for line in sys.stdin:
        try:
            gold, pred = json.loads(line)
            verdict = equivalent(gold, pred)
        except Exception:  # noqa: BLE001 - any parser failure means "not proven equal"
            verdict = False
        print("true" if verdict else "false", flush=True)


if __name__ == "__main__":
    main()
