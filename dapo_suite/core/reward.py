"""The rule-based reward of DAPO: +1 when the final answer equals the ground truth, -1 otherwise.

One function, `compute_score`, serves every stage: verl calls it as its `custom_reward_function`, the embedded
trainer calls it on each rollout, the evaluator grades with it. The protocol:

1. **Finding the answer.** The last line that starts with `Answer:` (case-insensitive, as in DAPO's prompt;
   markdown emphasis, a heading or the lead-in "So, the answer is:" before it allowed: `**Answer:** 42`,
   `### Final Answer: 42`, `So, the answer is: Answer: 12`, the embedded SmolLM2's habit) within the last
   `answer_window` characters (300, verl's `math_dapo` window: the protocol puts the answer on the last line).
   Minerva's `Final Answer: The final answer is $X$. I hope it is correct.` reads as X. Without such a line,
   the last `\\boxed{...}` of the whole response (documented fallback, as in verl 0.9.1, which looks only at
   the last 100 characters). "Answer:" inside a sentence ("so our answer: 6 ...") is prose, not the answer
   line.
2. **The ground truth decides the comparison.** A ground truth is an integer only when it is one bare number,
   with at most a unit, a degree sign or a percent sign (`42`, `1,000`, `28\\%`, `90^\\circ`,
   `10\\text{ cm}`). Then the answer must state that one integer: `$042$`, `42.0`, `**42**`, `x = 42`,
   `42 \\text{ cm}` do; `42 or 43`, `2x = 42`, `4, 2`, `42!` and expressions (`6 \\cdot 7`) do not. No
   arithmetic is done on model text.
3. **Every other ground truth** (fractions, radicals, tuples, comma lists, intervals, equations, relations,
   matrices, text) is compared by math-verify in `dapo_suite.core.symbolic`: equations as equations (up to a
   non-zero factor, through math-verify's solver), relations as relations, intervals as intervals, a comma
   list as a set and a bracketed one as a tuple. An answer never scores by matching one side of an equation or
   one element of a list. An answer past the checker's work bound (an exact number of more than 10,000 digits,
   a power of a symbol past 256, a tree of more than 600 nodes) says `too_complex: True`, on any machine at
   any load; a comparison within it that still runs out of its CPU or wall-clock budget says `timeout: True`.
   Both are "could not check", scored -1, and counted apart by the trainer (`reward/too_complex`,
   `reward/timeouts`) and the evaluator.

Deliberate differences from verl's `math_dapo.compute_score` (each has a test named `test_difference_*`): it
compares normalised strings, so `042`, `42.0`, `**42**`, `42 apples` and `28` against `28\\%` fail there,
while `$42$ or $43$`, `4, 2` (for 42) and `2x = 42` pass; it takes `Answer:` anywhere in a line; it cuts a
ground truth at its last `=`; and its `\\boxed{}` fallback sees only the last 100 characters.
"""

from __future__ import annotations

import re
from typing import Any

from dapo_suite.core.symbolic import SymbolicChecker

# characters of the response's tail searched for the `Answer:` line (verl's math_dapo: 300)
ANSWER_WINDOW = 300
MAX_BOX_CHARS = 1000  # a \boxed{ whose brace does not close within this is not an answer (bounds the scan)
MAX_SYMBOLIC_ANSWER_CHARS = 400  # the longest MATH-500 answer has 159 characters
UNCHECKED = ("timeout", "too_complex")  # a result's fields for an answer the checker could not check, by why

# matched at a line start: heading/quote marks, a lead-in, emphasis, (Final) Answer:
_ANSWER_LINE = re.compile(
    r"(?i)[ \t]*(?:[#>][#> \t]*)?"
    r"(?:(?:so|thus|therefore|hence)?[ \t]*,?[ \t]*the[ \t]+(?:final[ \t]+)?answer[ \t]+is[ \t]*:?[ \t]*)?"
    r"[*_]{0,3}(?:final[ \t]+)?answer[ \t]*[*_]{0,3}[ \t]*:[ \t]*[*_]{0,3}\s*(\S[^\n]*)"
)
_ANSWER_WORD = re.compile("answer", re.IGNORECASE)
_MINERVA_PREAMBLE = re.compile(r"(?i)^(?:the\s+)?(?:final\s+)?answer\s+is\s*:?\s*")
_MINERVA_CLOSING = re.compile(r"(?i)\s*I hope it is correct\.?\s*$")
_DELIMITERS = re.compile(r"\$|\\\(|\\\)|\\\[|\\\]|\*\*|\"")  # math-mode delimiters, markdown bold, quotes
_BOXED_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_WRAPPER = re.compile(
    r"\\(?:boxed|fbox|text|textnormal|textrm|textbf|textit|mbox|mathrm|mathbf|mathit|overline|displaystyle)"
    r"\s*\{([^{}]*)\}"
)
_NOISE = re.compile(r"\\left|\\right|\\displaystyle|\\\$|\\l?dots|\\cdots|\\quad")

# The integer path. Spacing: plain and LaTeX (\, \; \: \! \ ~). Thousands groups: 1,000  1{,}000  1,\!000
# 1\,000.
_SP = r"(?:\s|\\[,;:! ]|~)*"
_NUMBER = r"(?P<digits>\d{1,3}(?:(?:,\\!\s?|\{,\}|,|\\,|\\ |~)\d{3})+(?!\d)|\d+)(?:\.0*)?"
_PERCENT_OR_DEGREE = r"(?:\\?%|\s*percent\b|\s*pct\b|\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b)"
# units that may follow the number without a space ("42cm"); after a space any word is a unit
_GLUED_UNITS = (
    "cm|mm|km|m|kg|g|mg|s|sec|min|h|hr|hrs|mph|ft|in|lb|lbs|oz|cents|dollars|degrees|units|ways|students|"
    "people|days|hours|minutes|seconds|points|feet|inches|meters|pounds|digits|integers|edges|squares|th|st|nd|rd"
)
_UNIT = (
    r"(?:(?:(?:" + _GLUED_UNITS + r")\b|(?<=\s)[A-Za-z][A-Za-z'.-]*)"
    r"(?:\s+[A-Za-z][A-Za-z'.,-]*)*(?:\s*\^\s*\{?[23]\}?)?)"  # more words ("square units"), and cm^2
)
_INTEGER = re.compile(
    r"(?P<words>[A-Za-z][A-Za-z'\s,:-]*\s)?"  # leading words without digits: "a 42", "the answer is 42"
    rf"{_SP}(?P<sign>[+-]?){_SP}{_NUMBER}{_SP}{_PERCENT_OR_DEGREE}?{_SP}{_UNIT}?{_SP}\.?",
    re.IGNORECASE,
)
_NON_DIGIT = re.compile(r"\D")
_SUBSCRIPT_OR_CALL = re.compile(r"_\{[^{}]*\}|_\w|(?<=[A-Za-z])\([^()]*\)")  # a_{10}, a_1, f(3)
_ASSIGNEE = re.compile(
    r"[A-Za-z\\\s{}|'.:]+"
)  # what may stand left of `=` in an answer: names, not arithmetic
_LIST_MARK = re.compile(r"[,;]|\band\b|\bor\b")

# The symbolic path: the value without its presentation.
_TRAILING_UNIT = re.compile(
    r"(?<=\S)\s*\\(?:text|textnormal|textrm|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z\s.]*\}(?:\^\s*\{?[23]\}?)?\s*$"
)
_TRAILING_PERCENT = re.compile(r"(?<=\S)\s*(?:\\?%|percent|pct)\s*$", re.IGNORECASE)


def compute_score(
    data_source: str | None,
    solution_str: str | bytes | None,
    ground_truth: str | int | float | None,
    extra_info: dict | None = None,
    *,
    answer_window: int = ANSWER_WINDOW,
    **kwargs: Any,
) -> dict[str, Any]:
    """Score one response: `{"score": +1.0 or -1.0, "acc": bool, "pred": answer or None, "timeout": bool,
    "too_complex": bool}`.

    The signature is the one verl's `custom_reward_function` calls (`data_source` and `extra_info` are
    accepted and unused: one protocol for every source). Any input, however malformed, gets a score; nothing
    raises. `too_complex` is True when an answer is past the symbolic checker's work bound (the same verdict
    on any machine), `timeout` when a comparison within it still ran out of its CPU or wall-clock budget: the
    score is then -1, but the run can tell "could not check" from "wrong".
    """
    pred = extract_answer(_as_text(solution_str), answer_window)
    verdict = "different" if pred is None else answers_match(pred, _as_text(ground_truth))
    correct = verdict == "equal"
    return {
        "score": 1.0 if correct else -1.0,
        "acc": correct,
        "pred": pred,
        "timeout": verdict == "timeout",
        "too_complex": verdict == "too_complex",
    }


def extract_answer(text: str, window: int = ANSWER_WINDOW) -> str | None:
    """The last `Answer:` line starting in the response's last `window` characters, else the content of the
    last `\\boxed{}` of the whole response, else None; Minerva's phrasing and math delimiters removed."""
    line = _last_answer_line(text, max(0, len(text) - window))
    answer = line[1] if line is not None else last_boxed(text)
    return None if answer is None else clean_answer(answer)


def answer_mark(text: str, window: int = ANSWER_WINDOW) -> int | None:
    """Where the `Answer:` line that `extract_answer` reads has its "answer" word, or None when there is no
    such line (the answer, if any, is a `\\boxed{}`): where a reader splits the reasoning from the answer."""
    line = _last_answer_line(text, max(0, len(text) - window))
    return None if line is None else line[0]


def _last_answer_line(text: str, start: int) -> tuple[int, str] | None:
    """(position of its "answer" word, content) of the last `Answer:` line that starts at or after `start` (a
    line cut by the window is not one). Finds each "answer" in the window, last first, and matches its line:
    far cheaper than a regex scan."""
    for found in reversed([m.start() for m in _ANSWER_WORD.finditer(text, start)]):
        line_start = text.rfind("\n", 0, found) + 1
        if line_start < start:
            return None
        match = _ANSWER_LINE.match(text, line_start)
        if match and match.start(1) > found:  # this line is an answer line (not one with "answer" in prose)
            return found, match[1]
    return None


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (or `\\fbox{...}`) when its braces close, else None."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    opening = _BOXED_OPEN.match(text, start) if start >= 0 else None
    end = _closing_brace(text, opening.end() - 1) if opening else -1
    return text[opening.end() : end].strip() if end >= 0 else None


def _closing_brace(text: str, start: int) -> int:
    """Index of the `}` closing the `{` at `start`, or -1 when it does not close within MAX_BOX_CHARS."""
    depth = 0
    for i in range(start, min(len(text), start + MAX_BOX_CHARS)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1


def clean_answer(answer: str) -> str:
    """An answer without Minerva's phrasing ("The final answer is $X$. I hope it is correct."), math
    delimiters, markdown bold, a trailing period or an enclosing box."""
    text = _MINERVA_PREAMBLE.sub("", _MINERVA_CLOSING.sub("", answer.strip()))
    text = _DELIMITERS.sub(" ", text).strip().rstrip(".").strip()
    opening = _BOXED_OPEN.match(text)
    if opening and _closing_brace(text, opening.end() - 1) == len(text) - 1:  # the whole answer is one box
        text = text[opening.end() : -1].strip()
    return text


def parse_integer(answer: str, *, ground_truth: bool = False) -> int | None:
    """The one integer an answer states, or None when it states anything else (see the module docstring).

    A ground truth (`ground_truth=True`) must be the bare number: no leading words and no `=`.
    """
    if len(answer) > 200:
        return None
    bare = answer.strip()
    if (
        bare.isascii() and bare.lstrip("-").isdigit() and bare.count("-") <= 1
    ):  # fast path: most answers, most golds
        return int(bare)
    text = answer.replace("\u2212", "-")  # U+2212 is the typeset minus
    if "\\" in text:
        for _ in range(4):  # unwrap nested \boxed{\text{...}} layers
            unwrapped = _WRAPPER.sub(r" \1 ", text)
            if unwrapped == text:
                break
            text = unwrapped
        text = _NOISE.sub(" ", text)
        if not ground_truth:
            text = text.replace("\\approx", "=")  # `x \approx 42` names its value as `x = 42` does
    text = _DELIMITERS.sub(" ", text)
    if "=" in text:
        if ground_truth:
            return None
        text = _assigned_value(text)
        if text is None:
            return None
    match = _INTEGER.fullmatch(text.strip())
    if match is None or (ground_truth and match["words"]):
        return None
    digits = match["digits"]
    value = int(digits if digits.isdigit() else _NON_DIGIT.sub("", digits))
    return -value if match["sign"] == "-" else value


def _assigned_value(text: str) -> str | None:
    """`x = 42` -> `42`, `a_{10} = 5 + 5 = 10` -> `10`; None when the left side is arithmetic (`2x = 42`) or
    the text is a list of assignments (`x = 42, y = 5`)."""
    parts = text.split("=")
    if not _ASSIGNEE.fullmatch(_SUBSCRIPT_OR_CALL.sub("", parts[0])):
        return None
    if any(_LIST_MARK.search(part) for part in parts[1:-1]):
        return None
    return parts[-1]


def answers_match(pred: str, ground_truth: str) -> str:
    """Whether an extracted answer equals the ground truth, as one of the symbolic checker's `COMPARISONS`
    (`equal`, `different`, `too_complex`, `timeout`): as integers when the truth is one, else symbolically."""
    truth_int = parse_integer(ground_truth, ground_truth=True)
    if truth_int is not None:
        return "equal" if parse_integer(pred) == truth_int else "different"
    gold, answer = symbolic_form(ground_truth), symbolic_form(pred)
    if not gold or not answer or len(answer) > MAX_SYMBOLIC_ANSWER_CHARS:
        return "different"
    if _canonical_latex(answer) == _canonical_latex(gold):
        return "equal"
    return SYMBOLIC_CHECKER.compare(gold, answer)


def symbolic_form(answer: str) -> str:
    """The value of an answer for the symbolic checker: without delimiters, a dollar sign, a percent sign or a
    trailing `\\text{ unit}` (math-verify parses `28\\%` inside a box as text, and a text unit as a
    symbol)."""
    text = clean_answer(answer).replace("\\$", "").replace("\u2212", "-")
    for pattern in (_TRAILING_UNIT, _TRAILING_PERCENT):
        text = pattern.sub("", text)
    return text.strip()


def _canonical_latex(answer: str) -> str:
    text = _NOISE.sub("", answer).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\!", "")
    return "".join(text.split())


def _as_text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return value if isinstance(value, str) else str(value)


SYMBOLIC_CHECKER = SymbolicChecker()
