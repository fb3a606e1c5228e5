"""Is a rewrite still the original problem, asking for the record's integer? A deterministic check, run on
every rewrite after `forms.verify_rewrite`.

`verify_rewrite` proves that the declared form, parameters and target turn the *original answer* into the new
integer. It cannot see the rewritten text, so a rewriter (an LLM above all) could return a consistent rewrite
of another problem, or the original text still asking for the fraction. This module compares the texts. A
rewrite is faithful when:

1. it asks for the integer: when the integer is not the original answer itself (target != form), a rewrite
   whose text is the original's, or that still holds the original's format instruction ("Express your answer
   as a common fraction."), or whose last sentence asks for the original answer (a fraction, a probability,
   the form itself), is `rewrite_asks_for_non_integer`;
2. every sentence of the original before its final ask (the trailing question or instruction sentences) is in
   the rewrite word for word, numbers aside: none there -> `rewrite_changed_problem`; some lost ->
   `rewrite_dropped_condition`; there with other numbers (or the same numbers in another order) ->
   `rewrite_numbers_changed`;
3. every number of the original is in the rewrite, as often, whatever its notation: digits (`3`, `1,000`,
   `0.75`), fractions (`3/4`, `\\frac{3}{4}`, `\\dfrac34`), words (`three`, `twenty-one`, `one half`,
   `a third`, `twice`, `fifth`) all read as exact values (`three quarters` == `3/4` == `0.75`): else
   `rewrite_numbers_changed`;
4. every other `$...$` expression of the original (variables, conditions) is still in the rewrite, up to
   spacing and `\\dfrac`/`\\tfrac`/`\\left`/`\\right` (instructions that the integer form makes obsolete
   aside): else `rewrite_changed_problem`;
5. the rewrite's last sentence asks for exactly the target: it holds an expression (`$...$` or plain text such
   as `find m+n`) equal to the declared target (sympy, same parameter symbols; one other name, as in "If the
   answer is $x$, find $100x$", stands for the answer, that is for the form); and when it names the
   parameters, the rewrite says what they are (an expression equal to the form, `$\\frac{m}{n}$` or `m/n`):
   else `rewrite_asks_other_target` (`rewrite_asks_for_non_integer` when that sentence asks for the original
   answer).

A rewrite that leaves the problem unchanged is faithful when its integer is the original answer (form ==
target).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator

import sympy

from data_pipeline.forms import FormError, Rewrite, parse_expression

# Instructions about the answer's format, which an integer rewrite makes obsolete; the rules rewriter removes
# them. "Express as a ..." / "Express it in ..." too, but never "Express $0.\overline{3}$ as a common
# fraction" (the question itself, nor "Express as a common fraction: $...$"); it ends at "$\pi.$" too (the
# period inside the math), leaving no stray `$`.
OBSOLETE_INSTRUCTION = re.compile(
    r"\s*(?:Express|Give|Write|Enter)\s+(?:(?:your|the)\s+answer[^.]*?|(?:it\s+|this\s+)?(?=as\b|in\b)[^.$]*?)"
    r"(?:common fraction|simplest (?:radical )?form|radical form|in terms of \$?\\pi\$?|fraction|mixed "
    r"number|"
    r"simplest terms|lowest terms)(?:\.\$|[^.:$]*\.)",
    re.IGNORECASE,
)
_ASK = re.compile(
    r"^(?:find|compute|determine|what|which|how|evaluate|simplify|calculate|solve|express|give|write|"
    r"enter|round|if the answer)\b",
    re.IGNORECASE,
)
# Words by which a last sentence asks for a non-integer (only names the reason: the test is the target's
# absence)
_NON_INTEGER_ASK = re.compile(
    r"\b(?:fraction|probability|ratio|radical|decimal|mixed number|in terms of|percent|"
    r"simplify|simplest|lowest terms|exact value)\b",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"(?<=[.?!])\s+(?=\S)")
_MATH = re.compile(r"\$\$?([^$]+)\$\$?|\\\((.+?)\\\)")

# Numbers in every notation, read in this order (a span once read is blanked for the later patterns)
_LATEX_FRACTION = re.compile(
    r"\\[dt]?frac\s*(?:\{\s*(\d+(?:\.\d+)?)\s*\}|(\d))\s*(?:\{\s*(\d+(?:\.\d+)?)\s*\}|(\d))"
)
_PLAIN_FRACTION = re.compile(r"(?<![\w.\\/])(\d+)\s*/\s*(\d+)(?![\w./])")
_AFTER_COMMAND = re.compile(r"\\[A-Za-z]+(\d+(?:\.\d+)?)")  # \sqrt6: TeX ends a command name at a digit
_DIGITS = re.compile(r"(?<![A-Za-z_\\\d])(?:\d{1,3}(?:(?:,|\{,\})\d{3})+(?!\d)|\d*\.\d+|\d+)")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]+")
_UNITS = {
    w: i
    for i, w in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen".split()
    )
}
_TENS = {
    w: 10 * i for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split(), start=2)
}
_SCALES = {"hundred": 100, "thousand": 1000, "million": 10**6, "dozen": 12}
_ORDINALS = {
    w: i
    for i, w in enumerate(
        "first second third fourth fifth sixth seventh eighth ninth tenth eleventh twelfth".split(), start=1
    )
}
_DENOMINATORS = {
    "half": 2,
    "halves": 2,
    "quarter": 4,
    "quarters": 4,
    **{w: n for w, n in _ORDINALS.items() if n > 2},
    **{w + "s": n for w, n in _ORDINALS.items() if n > 2},
}
_MULTIPLES = {"twice": 2, "thrice": 3}
_MASK = "\x00"
_WORDS = re.compile(r"[A-Za-z]{2}")  # plain text with words in it (x-axis, one-half) is no expression
# A plain-text expression: letters/digits joined by operators (m+n, m/n, a + b); or the word after an ask verb
_PLAIN_EXPR = re.compile(r"(?<![\w\\])[\w()]+(?:\s*[-+*/^]\s*[\w()]+)+")
_ASKED_WORD = re.compile(
    r"\b(?:find|compute|determine|evaluate|calculate|what is|give)\s+(?:the value of\s+)?"
    r"([\w()]+)\b",
    re.IGNORECASE,
)


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


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


def _word_numbers(text: str) -> list[tuple[int, int, sympy.Rational]]:
    """Numbers written as words: cardinals (`twenty-one`, `two hundred`), fractions (`one half`, `a third`,
    `three quarters`), ordinals (`fifth`, not in "nearest tenth"), `twice`; as (start, end, value)."""
    tokens = [(m.start(), m.end(), m.group(0).lower()) for m in _WORD.finditer(text)]

    def joined(i: int) -> bool:  # token i continues token i-1's number ("twenty-one", "one half")
        return (
            i < len(tokens) and re.fullmatch(r"\s*-?\s*", text[tokens[i - 1][1] : tokens[i][0]]) is not None
        )

    found, i = [], 0
    while i < len(tokens):
        start, end, word = tokens[i]
        value: sympy.Rational | None = None
        j = i + 1
        if word in ("a", "an") and joined(j) and (tokens[j][2] in _DENOMINATORS or tokens[j][2] in _SCALES):
            value, j = _cardinal(tokens, i + 1, joined, sympy.Integer(1))
        elif word in _UNITS or word in _TENS:
            value, j = _cardinal(tokens, i, joined, sympy.Integer(0))
        elif word in ("half", *_MULTIPLES) or (
            word in _ORDINALS and (i == 0 or tokens[i - 1][2] != "nearest")
        ):
            value = (
                sympy.Rational(1, 2)
                if word == "half"
                else sympy.Integer(_MULTIPLES.get(word) or _ORDINALS[word])
            )
        if value is not None:
            found.append((start, tokens[j - 1][1], value))
        i = max(j, i + 1)
    return found


def _cardinal(
    tokens: list[tuple[int, int, str]], i: int, joined: Callable[[int], bool], current: sympy.Integer
) -> tuple[sympy.Rational, int]:
    """Read a cardinal from tokens[i] (`current` 1 after "a"), then an optional fraction word: (value, next
    i)."""
    total, last, j = sympy.Integer(0), "a" if current else None, i
    while j < len(tokens) and (j == i or joined(j)):
        word = tokens[j][2]
        if word in _UNITS and last != "unit" and not (last == "tens" and _UNITS[word] >= 10):
            current, last = current + _UNITS[word], "unit"
        elif word in _TENS and last not in ("unit", "tens"):
            current, last = current + _TENS[word], "tens"
        elif word in _SCALES and last is not None:
            if _SCALES[word] >= 1000:
                total, current = total + current * _SCALES[word], sympy.Integer(0)
            else:
                current = current * _SCALES[word]
            last = "scale"
        else:
            break
        j += 1
    value = total + current
    if j < len(tokens) and joined(j) and tokens[j][2] in _DENOMINATORS and value:
        return value / _DENOMINATORS[tokens[j][2]], j + 1
    return value, j


def _number_spans(text: str) -> list[tuple[int, int, sympy.Rational]]:
    """Every number of a text, whatever its notation, as (start, end, exact value), in order."""
    spans: list[tuple[int, int, sympy.Rational]] = []
    work = text
    for pattern in (_LATEX_FRACTION, _PLAIN_FRACTION, _AFTER_COMMAND, _DIGITS):
        for match in pattern.finditer(work):
            if pattern is _AFTER_COMMAND:
                spans.append((match.start(1), match.end(1), sympy.Rational(match.group(1))))
                continue
            parts = [g for g in match.groups() if g is not None] or [match.group(0)]
            numbers = [sympy.Rational(re.sub(r"[,{}]", "", p)) for p in parts]
            if len(numbers) == 2 and numbers[1] == 0:  # 3/0 is no fraction: its digits count one by one
                continue
            spans.append(
                (match.start(), match.end(), numbers[0] / numbers[1] if len(numbers) == 2 else numbers[0])
            )
        work = _blank(work, spans)
    spans += _word_numbers(work)
    return sorted(spans, key=lambda span: span[0])


def _blank(text: str, spans: list[tuple[int, int, sympy.Rational]]) -> str:
    for start, end, _ in spans:
        text = text[:start] + " " * (end - start) + text[end:]
    return text


def _masked(text: str) -> tuple[str, list[sympy.Rational]]:
    """The text with every number one mask character (whitespace and `$` removed), and the numbers in order:
    two texts that differ only in their numbers' notation have the same mask and the same numbers."""
    text = text.replace(_MASK, " ")
    spans = _number_spans(text)
    pieces, at = [], 0
    for start, end, _ in spans:
        pieces += [text[at:start], _MASK]
        at = end
    return _squash("".join([*pieces, text[at:]])).replace("$", ""), [value for _, _, value in spans]


def _sentence_status(sentence: str, rewrite: str, new_mask: str, new_values: list[sympy.Rational]) -> str:
    """ "kept" (word for word, or with the same numbers in another notation), "renumbered" (the same words
    with other numbers, or the same numbers in another order) or "lost"; `new_mask, new_values` are
    `_masked(rewrite)`."""
    if _squash(sentence) in _squash(rewrite):
        return "kept"
    mask, values = _masked(sentence)
    status, start = "lost", new_mask.find(mask)
    while start >= 0:
        offset = new_mask.count(_MASK, 0, start)
        if new_values[offset : offset + len(values)] == values:
            return "kept"
        status, start = "renumbered", new_mask.find(mask, start + 1)
    return status


def _math_spans(text: str) -> list[str]:
    """`$...$` contents; escaped dollars (currency) are not delimiters, and with an odd number of delimiters
    the pairing is ambiguous: no spans."""
    text = text.replace("\\$", " ")
    return [] if text.count("$") % 2 else [a or b for a, b in _MATH.findall(text)]


def _expressions(text: str) -> Counter[str]:
    """The `$...$` expressions that are more than a number (variables, conditions), normalised, with
    counts."""
    found: Counter[str] = Counter()
    for span in _math_spans(text):
        if re.fullmatch(r"[\s.,;:+\-]*", _masked(span)[0].replace(_MASK, "")):
            continue  # a number: compared by value with the others
        span = re.sub(r"\\[dt]frac", r"\\frac", re.sub(r"\\left|\\right", "", _squash(span)))
        found[f"${span.rstrip('.,;:')}$"] += 1
    return found


def _parse_math(span: str) -> sympy.Expr:
    """An expression as sympy, symbols by name as integers (LaTeX gives plain ones), a number's implicit
    product written out (`100x` -> `100*x`) and LaTeX's optional braces put in (`\\frac mn`, `\\sqrt c`)."""
    if "\\" in span:
        span = re.sub(r"\\([dt]?frac)\s*([A-Za-z0-9])\s*([A-Za-z0-9])", r"\\\1{\2}{\3}", span)
        span = re.sub(r"\\sqrt\s*([A-Za-z0-9])", r"\\sqrt{\1}", span)
    else:
        span = re.sub(r"(\d)([A-Za-z(])", r"\1*\2", span)
    expression = parse_expression(span)
    return expression.xreplace({s: sympy.Symbol(s.name, integer=True) for s in expression.free_symbols})


def _candidates(text: str, names: set[str] | None = None) -> Iterator[sympy.Expr]:
    """Every expression a text writes, last first (a rewrite's new sentences end it): `$...$` spans, then
    plain-text ones (`m/n`, `find m+n`) outside them; with `names`, only those that write each of these names
    (parsing every span of a long problem is slow)."""
    plain = _MATH.sub(" ", text.replace("\\$", " "))
    sources = [s for s in (*_PLAIN_EXPR.findall(plain), *_ASKED_WORD.findall(plain)) if not _WORDS.search(s)]
    for source in (*reversed(_math_spans(text)), *sources):
        if names and not all(
            re.search(rf"(?<![A-Za-z]){re.escape(name)}(?![A-Za-z])", source) for name in names
        ):
            continue
        try:
            yield _parse_math(source)
        except FormError:
            continue


def _equal(a: sympy.Expr, b: sympy.Expr) -> bool:
    """a == b for all parameter values. Forms and targets are rational functions of parameters, their roots
    and pi: `cancel` decides (far faster than `simplify`), after a numeric test at one point that rejects most
    pairs."""
    difference = a - b
    point = {s: sympy.prime(i + 6) for i, s in enumerate(sorted(difference.free_symbols, key=str))}
    try:
        if abs(complex(difference.xreplace(point).evalf(30))) > 1e-12:
            return False
    except (TypeError, ValueError, ZeroDivisionError):
        pass  # not a number at that point (a pole, a leftover function): cancel decides
    return sympy.cancel(difference) == 0


def _asked(sentence: str, rewrite: Rewrite, target: sympy.Expr, form: sympy.Expr) -> str | None:
    """How the sentence asks for the target: "target" (an expression of the parameters equal to it),
    "answer_name" (one other name stands for the answer: "If the answer is $x$, find $100x$"), or None."""
    for expression in _candidates(sentence):
        others = [s for s in expression.free_symbols if s.name not in rewrite.params]
        if len(others) > 1:
            continue
        how = "answer_name" if others else "target"
        expression = expression.xreplace({others[0]: form}) if others else expression
        if expression.free_symbols and _equal(expression, target):
            return how
    return None


def _states_form(text: str, form: sympy.Expr) -> bool:
    """The rewrite says what its parameters are: it writes an expression of them equal to the form."""
    names = {s.name for s in form.free_symbols}
    return any(
        e.free_symbols and not e.free_symbols - form.free_symbols and _equal(e, form)
        for e in _candidates(text, names)
    )


def _asks_non_integer(sentence: str, original: str, form: sympy.Expr) -> bool:
    """The sentence asks for the original answer: it is the original's, writes the form itself, or asks for a
    fraction, probability, ratio or simplified expression."""
    return (
        _squash(sentence) in _squash(original)
        or _NON_INTEGER_ASK.search(sentence) is not None
        or _states_form(sentence, form)
    )


def check_faithful(original: str, rewrite: Rewrite) -> tuple[bool, str]:
    """(True, "ok"), or (False, reason) with reason one of `rewrite_asks_for_non_integer`,
    `rewrite_changed_problem`, `rewrite_numbers_changed`, `rewrite_dropped_condition`,
    `rewrite_asks_other_target`, followed by what was wrong."""
    try:
        form, target = _parse_math(rewrite.form), _parse_math(rewrite.target or rewrite.form)
    except FormError as error:
        return False, f"rewrite_asks_other_target: form or target not understood ({error})"
    new_answer = not _equal(form, target)  # the integer asked for is not the original answer itself
    if _squash(rewrite.problem) == _squash(original):
        if not new_answer:
            return True, "ok"
        return False, (
            f"rewrite_asks_for_non_integer: the rewrite is the original text, which asks for the original "
            f"answer ({rewrite.form}), not for {rewrite.target} = {rewrite.answer}"
        )
    kept_text = OBSOLETE_INSTRUCTION.sub(" ", original)
    body, _ = _split_ask(_sentences(kept_text))
    new_mask, new_numbers = _masked(rewrite.problem)
    status = {s: _sentence_status(s, rewrite.problem, new_mask, new_numbers) for s in body}
    lost = [s for s in body if status[s] == "lost"]
    renumbered = [s for s in body if status[s] == "renumbered"]
    if lost and "kept" not in status.values():
        return False, (
            f"rewrite_changed_problem: none of the original's statements is in the rewrite ({lost[0][:80]!r})"
        )
    if renumbered:
        return False, f"rewrite_numbers_changed: {renumbered[0][:80]!r} is in the rewrite with other numbers"
    if lost:
        return False, f"rewrite_dropped_condition: {lost[0][:80]!r} is not in the rewrite"
    missing_numbers = Counter(_masked(kept_text)[1]) - Counter(new_numbers)
    if missing_numbers:
        numbers = ", ".join(str(n) for n in sorted(missing_numbers)[:5])
        return (
            False,
            f"rewrite_numbers_changed: the original's {numbers} not in the rewrite (in any notation)",
        )
    missing = _expressions(kept_text) - _expressions(rewrite.problem)
    if missing:
        return (
            False,
            f"rewrite_changed_problem: {', '.join(sorted(missing)[:5])} of the original not in the rewrite",
        )
    still = [
        m.group(0).strip()
        for m in OBSOLETE_INSTRUCTION.finditer(original)
        if _squash(m.group(0)) in _squash(rewrite.problem)
    ]
    if new_answer and still:
        return False, f"rewrite_asks_for_non_integer: the rewrite still says {still[0][:80]!r}"
    last = (_sentences(rewrite.problem) or [""])[-1]
    how = _asked(last, rewrite, target, form)
    if how is None:
        kind = (
            "rewrite_asks_for_non_integer"
            if new_answer and _asks_non_integer(last, original, form)
            else "rewrite_asks_other_target"
        )
        return False, f"{kind}: the last sentence ({last[:80]!r}) does not ask for {rewrite.target}"
    if new_answer and how == "target" and not _states_form(rewrite.problem, form):
        return False, (
            f"rewrite_asks_other_target: the rewrite asks for {rewrite.target} but never says what "
            f"{', '.join(sorted(rewrite.params))} are (no expression equal to {rewrite.form})"
        )
    return True, "ok"
