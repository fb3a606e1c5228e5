"""The rule-based reward of DAPO: +1 when the final answer equals the ground truth, -1 otherwise.

One function, `compute_score`, serves every stage: verl calls it as its `custom_reward_function`, the embedded
trainer calls it on each rollout, the evaluator grades with it. The protocol:

1. The answer is the last `Answer:` line (case-insensitive, as in DAPO's prompt) within the last
   `answer_window` characters of the response (300, verl's `math_dapo` window: the protocol puts the answer on
   the last line, and a bounded window keeps the cost constant on any input). Without one, the last complete
   `\\boxed{...}` in that window is used instead (documented fallback, as in verl 0.9.1).
2. Integer ground truths (DAPO-Math-17K, AIME, AMC, GSM8K) are compared as integers: `$042$`, `\\boxed{42}`,
   `42.0`, `4{,}2`, `1,000`, `x = 42`, `**42**`, `42 \\text{ cm}` all read as the number; an answer holding two
   numbers (`42 or 43`) or an expression (`2x`, `9^9^9^9`) is wrong. No arithmetic is ever done on model text.
3. Other ground truths (MATH-style `\\frac{1}{2}`, `3\\sqrt{2}`, intervals, tuples) are compared symbolically
   with math-verify's LaTeX parser in a separate worker process with a hard time limit, so the check works off
   the main thread and a pathological expression cannot hang or exhaust the caller. Only the LaTeX grammar
   parses model text; math-verify's plain-expression path (sympy `parse_expr`, which calls `eval`) is never used.

Where this differs from verl's `math_dapo.compute_score` on integer ground truths, verl is wrong: it compares
normalised strings, so `042` vs `42`, `42.0`, `**42**` or `42 apples` fail there. `tests/test_reward.py`
names each difference.
"""

from __future__ import annotations

import re
import threading
from typing import Any

ANSWER_WINDOW = 300  # characters of the response's tail searched for the answer (verl's math_dapo uses 300)
SYMBOLIC_TIMEOUT_S = 0.5  # hard limit for one symbolic comparison, worker start-up excluded
MAX_SYMBOLIC_ANSWER_CHARS = 400  # the longest MATH-500 answer has 159 characters

_ANSWER_LINE = re.compile(r"(?i)answer\s*:\s*([^\n]+)")
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_WRAPPER = re.compile(r"\\(?:boxed|fbox|mbox|text|textbf|textrm|mathrm|mathbf|overline|displaystyle)\s*\{([^{}]*)\}")
_NOISE = re.compile(r"\\left|\\right|\\[!,;:> ]|\\\$|\$|\*\*|\\\(|\\\)|\\\[|\\\]|\^\s*\{?\\circ\}?|°|~|\\l?dots|\\cdots|\"")
# Thousands separators and stray spacing between digits: "1,000", "4{,}2", "1\,000", "4 2" -> one number.
_DIGIT_SEPARATOR = re.compile(r"(?<=\d)(?:\s*,\s*|\{,\}|\s+)(?=\d)")
_UNITS = (
    "cm|mm|km|m|kg|g|mg|s|sec|min|h|hr|hrs|mph|ft|in|lb|lbs|oz|cents|dollars|degrees|units|ways|students|"
    "people|days|hours|minutes|seconds|points|feet|inches|meters|pounds|digits|integers|edges|squares|th|st|nd|rd"
)
_INTEGER_ANSWER = re.compile(
    r"(?:[A-Za-z][A-Za-z'\s,:-]*\s)?"  # leading words without digits: "a 42", "the answer is 42"
    r"(?P<sign>[+-]?)(?P<digits>\d+)(?:\.0*)?"  # the number; 42.0 and 42. read as 42
    r"(?:\s*(?:" + _UNITS + r")\b|\s+[A-Za-z][A-Za-z\s'.,-]*)?"  # a unit, or trailing words without digits
    r"\s*[.!]?",
    re.IGNORECASE,
)


def compute_score(
    data_source: str | None,
    solution_str: str | bytes | None,
    ground_truth: str | int | float | None,
    extra_info: dict | None = None,
    *,
    answer_window: int = ANSWER_WINDOW,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response: `{"score": +1.0 or -1.0, "acc": bool, "pred": extracted answer or None}`.

    The signature is the one verl's `custom_reward_function` calls (`data_source` and `extra_info` are accepted
    and unused: one protocol for every source). Any input, however malformed, gets a score; nothing raises.
    """
    text = _as_text(solution_str)
    pred = extract_answer(text, answer_window)
    correct = pred is not None and answers_match(pred, _as_text(ground_truth))
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}


def extract_answer(text: str, window: int = ANSWER_WINDOW) -> str | None:
    """The last `Answer:` line of the response's tail, else the last complete `\\boxed{}` there, else None."""
    tail = text[-window:]
    lines = _ANSWER_LINE.findall(tail)
    if lines:
        return lines[-1].strip()
    return last_boxed(tail)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) when its braces close, else None."""
    openings = list(_BOXED_OPEN.finditer(text))  # text is a bounded tail: listing every match is cheap
    if not openings:
        return None
    opening = openings[-1]
    depth = 0
    for i in range(opening.end() - 1, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[opening.end() : i].strip()
    return None


def parse_integer(answer: str) -> int | None:
    """The integer an answer string states, or None when it states anything else (see the module docstring)."""
    if len(answer) > 200:
        return None
    text = answer.rsplit("=", 1)[-1].replace("\u2212", "-")  # "x = 42"; U+2212 is the typeset minus
    for _ in range(4):  # unwrap nested \boxed{\text{...}} layers
        unwrapped = _WRAPPER.sub(r"\1", text)
        if unwrapped == text:
            break
        text = unwrapped
    text = _NOISE.sub(" ", text)
    text = _DIGIT_SEPARATOR.sub("", text).strip()
    match = _INTEGER_ANSWER.fullmatch(text)
    if match is None:
        return None
    value = int(match["digits"])
    return -value if match["sign"] == "-" else value


def answers_match(pred: str, ground_truth: str) -> bool:
    """Whether an extracted answer equals the ground truth: as integers when the truth is one, else symbolically."""
    truth_int = parse_integer(ground_truth)
    if truth_int is not None:
        return parse_integer(pred) == truth_int
    if _canonical_latex(pred) == _canonical_latex(ground_truth):
        return True
    if len(pred) > MAX_SYMBOLIC_ANSWER_CHARS or not ground_truth.strip():
        return False
    return SYMBOLIC_CHECKER.equivalent(ground_truth, pred)


def _canonical_latex(answer: str) -> str:
    text = _NOISE.sub("", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return "".join(text.split()).rstrip(".")


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


class SymbolicChecker:
    """Symbolic equivalence in a child process that is killed when one comparison exceeds its time limit.

    math-verify's own timeout uses SIGALRM, which only works on the main thread; a child process gives a hard
    limit from any thread and contains memory blow-ups. Importing sympy and math-verify takes a second or two,
    so a standby child is started alongside the active one: after a kill the standby takes over at once.
    Calls are serialised by a lock; one checker per process is enough for grading throughput.
    """

    def __init__(self, timeout_s: float = SYMBOLIC_TIMEOUT_S, startup_timeout_s: float = 60.0) -> None:
        self.timeout_s = timeout_s
        self.startup_timeout_s = startup_timeout_s
        self._lock = threading.Lock()
        self._active: _Worker | None = None
        self._standby: _Worker | None = None

    def equivalent(self, gold: str, pred: str) -> bool:
        """True when math-verify proves `pred` equal to `gold` within the time limit; False otherwise."""
        with self._lock:
            if self._active is None:
                self._active = self._standby or _Worker()
                self._standby = _Worker()
            try:
                self._active.wait_ready(self.startup_timeout_s)
                verdict = self._active.ask(gold, pred, self.timeout_s)
            except OSError:
                verdict = None
            if verdict is None:  # timed out or died: replace it with the warm standby
                self._active.kill()
                self._active = None
            return bool(verdict)

    def close(self) -> None:
        with self._lock:
            for worker in (self._active, self._standby):
                if worker is not None:
                    worker.kill()
            self._active = self._standby = None


class _Worker:
    """One `python -m dapo_suite._symbolic_worker` child speaking JSON lines over its stdin and stdout."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self.process = subprocess.Popen(
            [sys.executable, "-m", "dapo_suite._symbolic_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            encoding="ascii",
        )
        self.ready = False

    def wait_ready(self, timeout_s: float) -> None:
        if not self.ready:
            if self._read_line(timeout_s) != "ready":
                raise OSError("the symbolic checker did not start")
            self.ready = True

    def ask(self, gold: str, pred: str, timeout_s: float) -> bool | None:
        import json

        self.process.stdin.write(json.dumps([gold, pred]) + "\n")
        self.process.stdin.flush()
        reply = self._read_line(timeout_s)
        return None if reply is None else reply == "true"

    def _read_line(self, timeout_s: float) -> str | None:
        import select

        readable, _, _ = select.select([self.process.stdout], [], [], timeout_s)
        if not readable:
            return None
        line = self.process.stdout.readline()
        return line.strip() or None

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            stream.close()


SYMBOLIC_CHECKER = SymbolicChecker()
