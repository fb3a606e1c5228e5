"""Answer analysis: read a LaTeX answer into an exact sympy value and name its type.

Types: integer, rational, radical (a + b*sqrt(c) over d), pi_multiple (q*pi), decimal (written with a decimal
point: kept apart from `rational` because its rewrite scales by a power of ten), interval, tuple, expression
(free variables), other_constant (a number outside these families: cube roots, logs, trig values), text.

Only latex2sympy2_extended's LaTeX grammar reads answer text (never `sympify`/`eval`); decimals are read
exactly from their digits with `Rational`, so 0.1 is 1/10 and not a binary float.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import sympy

ANSWER_TYPES = (
    "integer",
    "rational",
    "radical",
    "pi_multiple",
    "decimal",
    "interval",
    "tuple",
    "expression",
    "other_constant",
    "text",
)
MAX_ANSWER_CHARS = 200  # longer answers are prose or tuples of formulas: never rewritable

_DECIMAL = re.compile(r"^(?P<sign>[+-]?)(?P<int>\d*)\.(?P<frac>\d+)$")
_GSM8K_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)
# Decorations that do not change the value: $...$, \boxed{}, \$ (currency), degrees, \!, \, \left \right.
_WRAPPERS = (
    (re.compile(r"^\$+|\$+$"), ""),
    (re.compile(r"\\boxed\s*\{(.*)\}$", re.DOTALL), r"\1"),
    (re.compile(r"\\\$|\\%|%"), ""),
    (re.compile(r"\^\s*\{?\\circ\}?|°|\\circ"), ""),
    (re.compile(r"\\[!,;: ]|\\left|\\right|\\displaystyle"), ""),
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    # units after a number: "180\text{ miles}", "2400 \mbox{ cm}^2", "1.85\ \text{USD}" -> the number
    (re.compile(r"^(.*[\d}])\s*\\(?:text|mbox|mathrm)\s*\{\s*[A-Za-z][A-Za-z ]*\}(?:\^\d)?\.?$"), r"\1"),
    # a variable named in the answer: "b = -4" -> "-4"
    (re.compile(r"^[A-Za-z]\s*=\s*"), ""),
    # braces LaTeX lets one omit: \frac43, \frac 18, \sqrt5
    (re.compile(r"\\frac\s*(\d)\s*(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\\frac\s*(\{[^{}]*\})\s*(\d)"), r"\\frac\1{\2}"),
    (re.compile(r"\\sqrt\s*(\d)"), r"\\sqrt{\1}"),
)
_TEXT = re.compile(
    r"\\(?:text|textbf|mbox|mathrm)\s*\{[^{}]*[A-Za-z]{2,}[^{}]*\}|^[A-Za-z][A-Za-z\s.,']{2,}$"
)
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:(?:,|\{,\})\d{3})+$")


@dataclass(frozen=True)
class AnswerInfo:
    """What answer analysis learned: the cleaned text, its type and (for numbers) the exact sympy value."""

    text: str
    type: str
    value: sympy.Expr | None = None


def gsm8k_final_answer(solution: str) -> str | None:
    """GSM8K's answer field is a worked solution ending in `#### N`; the gold answer is N."""
    match = _GSM8K_FINAL.search(solution)
    return match.group(1).replace(",", "").strip() if match else None


def solution_steps(solution: str) -> int | None:
    """Steps of a GSM8K-style worked solution (`... #### N`): its non-empty lines before `####`, one
    calculation each (GSM8K: 2 to 8 steps, Cobbe et al. 2021, arXiv 2110.14168). None when the text is not
    such a solution. A free difficulty estimate: the 135M model solves 2-step problems far more often than
    6-step ones."""
    if not _GSM8K_FINAL.search(solution):
        return None
    return sum(1 for line in solution.split("####")[0].splitlines() if line.strip())


def clean_answer(answer: str) -> str:
    """Strip decorations that do not change the value ($, \\boxed, units of currency, degrees, spacing)."""
    text = answer.strip()
    for pattern, replacement in _WRAPPERS:
        text = pattern.sub(replacement, text).strip()
    if _THOUSANDS.match(text):
        text = text.replace("{,}", "").replace(",", "")
    return text


def parse_latex_value(text: str) -> sympy.Expr | None:
    """An exact sympy value for a LaTeX number or expression, or None when the grammar rejects it."""
    from latex2sympy2_extended import latex2sympy

    decimal = _DECIMAL.match(text)
    if decimal:
        digits = decimal["frac"]
        value = sympy.Rational(int((decimal["int"] or "0") + digits), 10 ** len(digits))
        return -value if decimal["sign"] == "-" else value
    try:
        value = latex2sympy(text)
    except Exception:  # the grammar raises many error types on text it does not cover
        return None
    if not isinstance(value, sympy.Basic):
        return None
    return value


def analyse_answer(answer: str) -> AnswerInfo:
    """Type and exact value of one answer (pure: the same text always gives the same result)."""
    text = clean_answer(answer)
    if not text or len(text) > MAX_ANSWER_CHARS:
        return AnswerInfo(text, "text")
    if _TEXT.search(text):
        return AnswerInfo(text, "text")
    if "\\infty" in text or "\\cup" in text or text[0] == "[" or text[-1] == "]":
        return AnswerInfo(text, "interval")
    if "," in text and "{,}" not in text:
        # (1,2) is a point far more often than an open interval in MATH; both are out of reach of a rewrite.
        return AnswerInfo(text, "tuple")
    value = parse_latex_value(text)
    if (
        value is None
        or isinstance(value, (sympy.Set, sympy.logic.boolalg.Boolean))
        or not isinstance(value, sympy.Expr)
    ):
        return AnswerInfo(text, "text")
    if value.free_symbols:
        return AnswerInfo(text, "expression", value)
    return AnswerInfo(text, classify_value(value, decimal=bool(_DECIMAL.match(text))), value)


def classify_value(value: sympy.Expr, decimal: bool = False) -> str:
    """Family of an exact numeric value (see the module docstring)."""
    if value.is_Integer:
        return "integer"
    if value.is_Rational:
        return "decimal" if decimal else "rational"
    if value.has(sympy.pi):
        ratio = sympy.simplify(value / sympy.pi)
        if ratio.is_Rational:
            return "pi_multiple"
        return "other_constant"
    if radical_parts(value) is not None:
        return "radical"
    return "other_constant"


def radical_parts(value: sympy.Expr) -> tuple[int, int, int, int] | None:
    """(a, b, c, d) with value == (a + b*sqrt(c)) / d, c > 1 square-free, b != 0, d >= 1, gcd(a, b, d) == 1.

    None when the value is not of that shape (two different radicals, a cube root, an integer...).
    """
    expr = sympy.expand(sympy.radsimp(value))
    rational = sympy.Integer(0)
    coefficient = None
    radicand = None
    for term in sympy.Add.make_args(expr):
        coeff, rest = term.as_coeff_Mul()
        if rest == 1:
            rational += coeff
            continue
        if not (isinstance(rest, sympy.Pow) and rest.exp == sympy.Rational(1, 2) and rest.base.is_Integer):
            return None
        if radicand is not None and rest.base != radicand:
            return None
        radicand = rest.base
        coefficient = coeff if coefficient is None else coefficient + coeff
        if not coeff.is_Rational:
            return None
    if radicand is None or coefficient is None or coefficient == 0 or not rational.is_Rational:
        return None
    d = sympy.ilcm(sympy.Rational(rational).q, sympy.Rational(coefficient).q)
    return int(rational * d), int(coefficient * d), int(radicand), int(d)
