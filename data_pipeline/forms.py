"""Verification of integer rewrites: a rewrite declares a *form* (an expression in integer parameters, such as
`k - m*sqrt(n)`), the parameter values, and a *target* (`k + m + n`). It is kept only when sympy proves:

1. the form with those parameters equals the original answer exactly (`(form - answer)` simplifies to 0);
2. every parameter is an integer, positive unless the form is a single parameter (`n`, any integer), every
   parameter under a square root is square-free and > 1, and when a parameter divides, the parameters outside
   the roots have gcd 1 (the "relatively prime" / "lowest terms" clause that makes the parameters unique);
3. the form has no more free coefficients than the value can pin down: parameters outside roots <= distinct
   basis terms (1, sqrt(c), pi, ...) + 1 if a parameter divides. `a + b` for 7 is rejected (not unique);
4. the target evaluated at the parameters is an integer equal to the declared integer answer.

Forms and targets are read by a whitelist parser over Python's `ast` (numbers, parameter names, + - * / ^,
`sqrt`, `pi`) or by latex2sympy2_extended for LaTeX; model text never reaches `eval` or `sympify`.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass, field

import sympy

MAX_FORM_CHARS = 120
MAX_EXPONENT = 12
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,7}$")


class FormError(ValueError):
    """A form or target that the whitelist parser refuses (the reason is the message)."""


@dataclass(frozen=True)
class Rewrite:
    """An integer rewrite of one problem, from any rewriter: what the verifier checks."""

    problem: str
    answer: int
    form: str
    params: dict[str, int] = field(default_factory=dict)
    target: str = ""
    rewriter: str = "rules"


def parse_expression(text: str) -> sympy.Expr:
    """Parse `text` (plain `(a+b*sqrt(c))/d` or LaTeX `\\frac{a+b\\sqrt{c}}{d}`) into sympy, symbols for
    names."""
    text = text.strip().strip("$").strip()
    if not text:
        raise FormError("empty expression")
    if len(text) > MAX_FORM_CHARS:
        raise FormError(f"expression longer than {MAX_FORM_CHARS} characters")
    if "\\" in text:
        from latex2sympy2_extended import latex2sympy

        try:
            value = latex2sympy(text)
        except Exception as error:  # the LaTeX grammar raises many error types
            raise FormError(f"LaTeX not understood: {error}") from None
        if not isinstance(value, sympy.Expr):
            raise FormError("LaTeX is not an expression")
        return value
    try:
        tree = ast.parse(text.replace("^", "**").replace("π", "pi"), mode="eval")
    except SyntaxError:
        raise FormError(f"not an expression: {text!r}") from None
    return _to_sympy(tree.body)


def _to_sympy(node: ast.AST) -> sympy.Expr:
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return sympy.Integer(node.value)
    if isinstance(node, ast.Name):
        if node.id == "pi":
            return sympy.pi
        if not _NAME.match(node.id):
            raise FormError(f"bad name {node.id!r}")
        return sympy.Symbol(node.id, integer=True)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        operand = _to_sympy(node.operand)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        left, right = _to_sympy(node.left), _to_sympy(node.right)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        if isinstance(node.op, ast.Div):
            return left / right
        if isinstance(node.op, ast.Pow):
            if not (right.is_Integer or right == sympy.Rational(1, 2)) or abs(right) > MAX_EXPONENT:
                raise FormError("exponents must be small integers or 1/2")
            return left**right
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "sqrt"
        and len(node.args) == 1
        and not node.keywords
    ):
        return sympy.sqrt(_to_sympy(node.args[0]))
    raise FormError(f"not allowed in a form: {ast.dump(node)[:60]}")


def _symbols_by_name(expr: sympy.Expr) -> dict[str, sympy.Symbol]:
    return {s.name: s for s in expr.free_symbols}


def verify_rewrite(original: sympy.Expr, rewrite: Rewrite) -> tuple[bool, str]:
    """(True, "verified") when the rewrite's integer provably follows from `original`; else (False,
    reason)."""
    try:
        form = parse_expression(rewrite.form)
        target = parse_expression(rewrite.target or rewrite.form)
    except FormError as error:
        return False, f"unparsable_form: {error}"
    names = _symbols_by_name(form)
    if set(_symbols_by_name(target)) - set(names):
        return False, "target_uses_unknown_parameter"
    if set(names) != set(rewrite.params):
        return False, f"parameters_mismatch: form has {sorted(names)}, given {sorted(rewrite.params)}"
    params: dict[str, int] = {}
    for name, value in rewrite.params.items():
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                return False, f"parameter_not_integer: {name}={value!r}"
        params[name] = value
    single = form.is_Symbol
    if not single and any(v <= 0 for v in params.values()):
        return False, "parameter_not_positive"
    radicands = _radicand_names(form)
    for name in radicands:
        if params[name] <= 1 or not _square_free(params[name]):
            return False, f"radicand_not_square_free: {name}={params[name]}"
    others = [n for n in names if n not in radicands]
    divides = _has_parameter_denominator(form)
    if divides and math.gcd(*(abs(params[n]) for n in others)) != 1:
        return False, "parameters_not_coprime"
    if len(others) > _basis_size(form) + int(divides):
        return False, "form_not_unique"
    # by name: LaTeX forms give plain symbols, plain forms integer ones
    value = form.xreplace({s: sympy.Integer(params[s.name]) for s in form.free_symbols})
    difference = sympy.simplify(sympy.radsimp(value - original))
    if difference != 0:
        return False, "form_value_differs_from_answer"
    target_value = sympy.simplify(
        target.xreplace({s: sympy.Integer(params[s.name]) for s in target.free_symbols})
    )
    if not target_value.is_Integer:
        return False, "target_not_integer"
    if int(target_value) != rewrite.answer:
        return False, f"integer_mismatch: target gives {int(target_value)}, rewrite says {rewrite.answer}"
    return True, "verified"


def _radicand_names(form: sympy.Expr) -> set[str]:
    names: set[str] = set()
    for power in form.atoms(sympy.Pow):
        if power.exp == sympy.Rational(1, 2) or power.exp == -sympy.Rational(1, 2):
            names |= {s.name for s in power.base.free_symbols}
    return names


def _has_parameter_denominator(form: sympy.Expr) -> bool:
    _, denominator = sympy.fraction(sympy.together(form))
    return bool(denominator.free_symbols)


def _basis_size(form: sympy.Expr) -> int:
    """Number of distinct irrational factors (1, sqrt(.), pi, ...) among the numerator's terms."""
    numerator, _ = sympy.fraction(sympy.together(form))
    bases = set()
    for term in sympy.Add.make_args(sympy.expand(numerator)):
        irrational = [f for f in sympy.Mul.make_args(term) if not (f.is_Symbol or f.is_Number)]
        bases.add(tuple(sorted(map(str, irrational))))
    return len(bases)


def _square_free(n: int) -> bool:
    return all(e == 1 for e in sympy.factorint(n).values())
