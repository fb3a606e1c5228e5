"""The `rules` rewriter: deterministic integer rewrites for the answer families whose target is computable.

| family | answer | appended wording (AIME style) | integer |
|---|---|---|---|
| integer | 42, -7 | none: the problem is kept as it is | the answer |
| rational | -3/4 | "...written as $-\\frac{m}{n}$, where $m$ and $n$ are relatively prime positive integers.
Find $m+n$." | 7 | | radical | 11-2*sqrt(6) | "...in the form $k-m\\sqrt{n}$, where ... $n$ is not divisible
by the square of any prime. Find $k+m+n$." | 19 | | radical | (3+sqrt(5))/2 | form $\\frac{a+b\\sqrt{c}}{d}$
with gcd(a, b, d) = 1; find a+b+c+d | 11 | | pi_multiple | 2*pi, 3*pi/4 | "$k\\pi$ ... Find $k$." /
"$\\frac{m\\pi}{n}$ ... Find $m+n$." | 2, 7 | | decimal | 0.375 | "If the answer is $x$, find $1000x$." (power
of ten from the digits written) | 375 |

Instructions the rewrite makes obsolete ("Express your answer as a common fraction.", "in simplest radical
form", "in terms of $\\pi$") are removed. Parameter letters avoid the letters the problem already uses.
Every rewrite here goes through the same verifier as the LLM's (`forms.verify_rewrite`).
"""

from __future__ import annotations

import re

import sympy

from data_pipeline.answers import AnswerInfo, radical_parts
from data_pipeline.faithful import OBSOLETE_INSTRUCTION
from data_pipeline.forms import Rewrite, parse_expression

_LETTER_SETS = (("m", "n", "p", "q"), ("a", "b", "c", "d"), ("k", "l", "r", "s"), ("u", "v", "w", "z"))


def rewrite_with_rules(problem: str, info: AnswerInfo) -> tuple[Rewrite | None, str]:
    """(rewrite, "ok") for a rewritable answer, (None, reason) otherwise. Pure."""
    if info.type == "integer":
        return Rewrite(problem, int(info.value), "n", {"n": int(info.value)}, "n", "rules"), "ok"
    if info.type not in ("rational", "radical", "pi_multiple", "decimal"):
        return None, f"no_rule_for_{info.type}"
    stem = OBSOLETE_INSTRUCTION.sub("", problem).rstrip()
    letters = _free_letters(problem)
    if info.type == "decimal":
        letters = letters + tuple(v for v in ("x", "y", "t") if _uses(problem, v))
    builder = {"rational": _rational, "radical": _radical, "pi_multiple": _pi_multiple, "decimal": _decimal}
    built = builder[info.type](info, letters)
    if built is None:
        return None, f"no_rule_for_{info.type}"
    form, params, target, wording = built
    answer = int(
        parse_expression(target).xreplace({sympy.Symbol(k, integer=True): v for k, v in params.items()})
    )
    return Rewrite(f"{stem} {wording}", answer, form, params, target, "rules"), "ok"


def _free_letters(problem: str) -> tuple[str, ...]:
    """The first letter set none of whose letters stands alone in the problem (as in `$m$` or `m =`)."""
    for letters in _LETTER_SETS:
        if not any(_uses(problem, c) for c in letters):
            return letters
    return _LETTER_SETS[0]


def _uses(problem: str, letter: str) -> bool:
    return re.search(rf"(?<![A-Za-z\\]){letter}(?![A-Za-z])", problem) is not None


def _rational(info: AnswerInfo, letters):
    value = sympy.Rational(info.value)
    m, n = letters[0], letters[1]
    sign = "-" if value < 0 else ""
    params = {m: abs(int(value.p)), n: int(value.q)}
    form = f"{sign}{m}/{n}"
    wording = (
        f"The answer can be written as ${sign}\\frac{{{m}}}{{{n}}}$, where ${m}$ and ${n}$ are relatively "
        f"prime positive integers. Find ${m}+{n}$."
    )
    return form, params, f"{m}+{n}", wording


def _radical(info: AnswerInfo, letters):
    parts = radical_parts(info.value)
    if parts is None:
        return None
    a, b, c, d = parts
    la, lb, lc, ld = letters
    # Terms with their signs, positive parameters: 11-2*sqrt(6) -> "k - m sqrt(n)"; -2+4*sqrt(3) -> "b sqrt(c)
    # - a"
    root_plain, root_tex = f"{lb}*sqrt({lc})", f"{lb}\\sqrt{{{lc}}}"
    params = {lb: abs(b), lc: c}
    if a == 0:
        plain = ("-" if b < 0 else "") + root_plain
        tex = ("-" if b < 0 else "") + root_tex
        names = [lb, lc]
    else:
        params[la] = abs(a)
        if a > 0:
            plain = f"{la}{'-' if b < 0 else '+'}{root_plain}"
            tex = f"{la}{'-' if b < 0 else '+'}{root_tex}"
        elif b > 0:
            plain, tex = f"{root_plain}-{la}", f"{root_tex}-{la}"
        else:
            plain, tex = f"-{la}-{root_plain}", f"-{la}-{root_tex}"
        names = [la, lb, lc]
    if d > 1:
        params[ld] = d
        plain, tex = f"({plain})/{ld}", f"\\frac{{{tex}}}{{{ld}}}"
        names.append(ld)
    listed = (
        ", ".join(f"${x}$" for x in names[:-1]) + f", and ${names[-1]}$"
        if len(names) > 2
        else f"${names[0]}$ and ${names[1]}$"
    )
    coprime = ""
    if d > 1:
        others = [x for x in names if x != lc]
        coprime = " and the greatest common divisor of " + ", ".join(f"${x}$" for x in others) + " is $1$"
    wording = (
        f"The answer can be written in the form ${tex}$, where {listed} are positive integers, ${lc}$ is not "
        f"divisible by the square of any prime{coprime}. Find ${'+'.join(names)}$."
    )
    return plain, params, "+".join(names), wording


def _pi_multiple(info: AnswerInfo, letters):
    ratio = sympy.Rational(sympy.simplify(info.value / sympy.pi))
    sign = "-" if ratio < 0 else ""
    m, n = letters[0], letters[1]
    if ratio.q == 1:
        k = letters[2]
        return (
            f"{sign}{k}*pi",
            {k: abs(int(ratio.p))},
            k,
            f"The answer can be written as ${sign}{k}\\pi$, where ${k}$ is a positive integer. Find ${k}$.",
        )
    wording = (
        f"The answer can be written as ${sign}\\frac{{{m}\\pi}}{{{n}}}$, where ${m}$ and ${n}$ are "
        f"relatively prime positive integers. Find ${m}+{n}$."
    )
    return f"{sign}{m}*pi/{n}", {m: abs(int(ratio.p)), n: int(ratio.q)}, f"{m}+{n}", wording


def _decimal(info: AnswerInfo, letters):
    digits = info.text.split(".", 1)[1] if "." in info.text else ""
    places = len(re.match(r"\d*", digits).group(0))
    scale = 10**places
    scaled = sympy.Rational(info.value) * scale
    if not scaled.is_Integer:
        return None
    if scaled == 0:
        return None
    x = next(v for v in ("x", "y", "t", "z") if v not in letters)
    n = letters[1]
    sign = "-" if scaled < 0 else ""
    return (
        f"{sign}{n}/{scale}",
        {n: abs(int(scaled))},
        f"{sign}{n}",
        f"If the answer is ${x}$, find ${scale}{x}$.",
    )
