"""Is a rewrite still the original problem? A deterministic check, run on every rewrite after `forms.verify_rewrite`.

`verify_rewrite` proves that the declared form, parameters and target turn the *original answer* into the new
integer. It cannot see the rewritten text, so a rewriter (an LLM above all) could return a consistent rewrite of
another problem. This module compares the texts. A rewrite is faithful when:

1. every sentence of the original before its final ask (the trailing question or instruction sentences) is in the
   rewrite word for word (whitespace aside): none kept -> `rewrite_changed_problem`; some lost ->
   `rewrite_dropped_condition` (`rewrite_changed_problem` when the sentence is there with other numbers);
2. every number and every `$...$` expression of the original (instructions that the integer form makes obsolete,
   such as "Express your answer as a common fraction.", aside) is still in the rewrite, as often as in the original:
   else `rewrite_changed_problem` (a number, variable or condition of the question changed);
3. the rewrite's last sentence asks for exactly the target: it holds a `$...$` expression equal to the declared
   target (sympy, same parameter symbols; one other name, as in "If the answer is $x$, find $100x$", stands for
   the answer, that is for the form): else `rewrite_asks_other_target`.

A rewrite that leaves the problem unchanged (an answer already an integer) is faithful by definition.
"""

from __future__ import annotations

import re
from collections import Counter

import sympy

from data_pipeline.forms import FormError, Rewrite, parse_expression

# Instructions about the answer's format, which an integer rewrite makes obsolete; the rules rewriter removes them.
OBSOLETE_INSTRUCTION = re.compile(
    r"\s*(?:Express|Give|Write|Enter)\s+(?:your|the)\s+answer[^.]*?"
    r"(?:common fraction|simplest (?:radical )?form|radical form|in terms of \$?\\pi\$?|fraction|mixed number|"
    r"simplest terms|lowest terms)[^.]*\.",
    re.IGNORECASE,
)
_ASK = re.compile(r"^(?:find|compute|determine|what|which|how|evaluate|simplify|calculate|solve|express|give|write|"
                  r"enter|round|if the answer)\b", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=\S)")
_MATH = re.compile(r"\$\$?([^$]+)\$\$?|\\\((.+?)\\\)")
_NUMBER = re.compile(r"(?<![A-Za-z_\\])\d+(?:\.\d+)?")


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _without_numbers(text: str) -> str:
    return _squash(_NUMBER.sub("#", text))


def _sentences(text: str) -> list[str]:
    """Sentences, split after . ? ! outside `$...$` (a decimal point has no space after it)."""
    masked = _MATH.sub(lambda m: "$" + "x" * (len(m.group(0)) - 2) + "$", text)
    cuts = [m.end() for m in _SENTENCE_END.finditer(masked)]
    pieces = [text[a:b].strip() for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    return [p for p in pieces if p]


def _split_ask(sentences: list[str]) -> tuple[list[str], list[str]]:
    """(body, ask): the ask is the trailing run of questions and instructions, at least the last sentence."""
    start = len(sentences) - 1
    while start > 0 and (sentences[start - 1].endswith("?") or _ASK.match(sentences[start - 1])):
        start -= 1
    return sentences[:start], sentences[start:]


def _quantities(text: str) -> Counter[str]:
    """Numbers and `$...$` expressions (whitespace removed) of a text, with their counts. Escaped dollars
    (currency) are not delimiters; with an odd number of delimiters the pairing is ambiguous and only the numbers
    count."""
    text = text.replace("\\$", " ")
    numbers = Counter(_NUMBER.findall(text))
    if text.count("$") % 2:
        return numbers
    return numbers + Counter(f"${_squash(a or b)}$" for a, b in _MATH.findall(text))


def _parse_math(span: str) -> sympy.Expr:
    """A `$...$` span as sympy, with a number's implicit product written out (`100x` -> `100*x`)."""
    return parse_expression(span if "\\" in span else re.sub(r"(\d)([A-Za-z(])", r"\1*\2", span))


def _asks_for_target(sentence: str, rewrite: Rewrite) -> bool:
    try:
        target, form = parse_expression(rewrite.target), parse_expression(rewrite.form)
    except FormError:
        return False
    for a, b in _MATH.findall(sentence.replace("\\$", " ")):
        try:
            expression = _parse_math(a or b)
        except FormError:
            continue
        # LaTeX parsing makes plain symbols; compare on names, as integers like the form's parameters
        expression = expression.xreplace({s: sympy.Symbol(s.name, integer=True) for s in expression.free_symbols})
        others = [s for s in expression.free_symbols if s.name not in rewrite.params]
        if len(others) == 1:  # "If the answer is $x$, find $100x$": the one other name stands for the answer
            expression = expression.xreplace({others[0]: form})
        elif others:
            continue
        if expression.free_symbols and sympy.simplify(expression - target) == 0:
            return True
    return False


def check_faithful(original: str, rewrite: Rewrite) -> tuple[bool, str]:
    """(True, "ok"), or (False, reason) with reason one of `rewrite_changed_problem`, `rewrite_dropped_condition`,
    `rewrite_asks_other_target`, followed by what was missing."""
    if _squash(rewrite.problem) == _squash(original):
        return True, "ok"
    new = _squash(rewrite.problem)
    kept_text = OBSOLETE_INSTRUCTION.sub(" ", original)
    body, _ = _split_ask(_sentences(kept_text))
    lost = [s for s in body if _squash(s) not in new]
    if body and len(lost) == len(body):
        return False, f"rewrite_changed_problem: none of the original's statements is in the rewrite ({lost[0][:80]!r})"
    renumbered = [s for s in lost if _without_numbers(s) in _without_numbers(rewrite.problem)]
    if renumbered:
        return False, f"rewrite_changed_problem: {renumbered[0][:80]!r} is in the rewrite with other numbers"
    if lost:
        return False, f"rewrite_dropped_condition: {lost[0][:80]!r} is not in the rewrite"
    missing = _quantities(kept_text) - _quantities(rewrite.problem)
    if missing:
        return False, f"rewrite_changed_problem: {', '.join(sorted(missing)[:5])} of the original not in the rewrite"
    last = _sentences(rewrite.problem)[-1]
    if not _asks_for_target(last, rewrite):
        return False, f"rewrite_asks_other_target: the last sentence ({last[:80]!r}) does not ask for {rewrite.target}"
    return True, "ok"
