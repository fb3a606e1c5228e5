"""The rules rewriter, the verifier and the answer analysis on tables of answers; dedup and decontamination on
small hand-made sets."""

from __future__ import annotations

import pytest
import sympy

from data_pipeline.answers import analyse_answer, gsm8k_final_answer
from data_pipeline.decontam import ContaminationIndex, decontaminate
from data_pipeline.dedup import exact_duplicates, near_duplicates
from data_pipeline.forms import FormError, Rewrite, parse_expression, verify_rewrite
from data_pipeline.rules import rewrite_with_rules
from data_pipeline.text import match_key, repair_text

PROBLEM = "Compute the value of the expression. Express your answer as a common fraction."

# answer, type, integer after the rules rewrite (None: no rule), form
REWRITES = [
    ("42", "integer", 42, "n"),
    ("-7", "integer", -7, "n"),
    ("$042$", "integer", 42, "n"),
    ("\\boxed{1,000}", "integer", 1000, "n"),
    ("180\\text{ miles}", "integer", 180, "n"),
    ("\\frac{1}{2}", "rational", 3, "m/n"),
    ("\\dfrac{6}{8}", "rational", 7, "m/n"),
    ("-\\frac{3}{4}", "rational", 7, "-m/n"),
    ("\\frac43", "rational", 7, "m/n"),
    ("2\\frac{1}{4}", "rational", 13, "m/n"),
    ("11-2\\sqrt{6}", "radical", 19, "m-n*sqrt(p)"),
    ("\\frac{3+\\sqrt{5}}{2}", "radical", 11, "(m+n*sqrt(p))/q"),
    ("\\sqrt{12}", "radical", 5, "n*sqrt(p)"),
    ("4\\sqrt{3}-2", "radical", 9, "n*sqrt(p)-m"),
    ("\\frac{\\sqrt{3}}{2}", "radical", 6, "(n*sqrt(p))/q"),
    ("-2-\\sqrt{3}", "radical", 6, "-m-n*sqrt(p)"),
    ("2\\pi", "pi_multiple", 2, "p*pi"),
    ("\\frac{3\\pi}{4}", "pi_multiple", 7, "m*pi/n"),
    ("-\\pi", "pi_multiple", 1, "-p*pi"),
    ("0.375", "decimal", 375, "n/1000"),
    ("-2.5", "decimal", -25, "-n/10"),
    ("\\$18.90", "decimal", 1890, "n/100"),
    ("(1,2)", "tuple", None, None),
    ("[0,1)", "interval", None, None),
    ("(-\\infty, 3]", "interval", None, None),
    ("x^2+1", "expression", None, None),
    ("\\text{Monday}", "text", None, None),
    ("\\sqrt[3]{2}", "other_constant", None, None),
    ("\\sqrt{2}+\\sqrt{3}", "other_constant", None, None),
]


@pytest.mark.parametrize("answer,kind,integer,form", REWRITES)
def test_rules_rewrite_and_verify(answer: str, kind: str, integer: int | None, form: str | None) -> None:
    info = analyse_answer(answer)
    assert info.type == kind
    rewrite, reason = rewrite_with_rules(PROBLEM, info)
    if integer is None:
        assert rewrite is None and reason == f"no_rule_for_{kind}"
        return
    assert rewrite is not None, reason
    assert (rewrite.answer, rewrite.form) == (integer, form)
    assert verify_rewrite(info.value, rewrite) == (True, "verified")
    if kind != "integer":
        assert "common fraction" not in rewrite.problem  # the obsolete instruction is removed
        assert rewrite.problem.startswith("Compute the value of the expression.")


def test_rules_pick_letters_the_problem_does_not_use() -> None:
    rewrite, _ = rewrite_with_rules(
        "Let $m$ and $n$ satisfy $m+n=1$. Find $m/n$.", analyse_answer("\\frac{1}{2}")
    )
    assert rewrite.form == "a/b" and "Find $a+b$." in rewrite.problem


HALF = sympy.Rational(1, 2)
# (original value, rewrite) -> reason the verifier gives
VERIFY_TABLE = [
    (HALF, Rewrite("p", 3, "m/n", {"m": 1, "n": 2}, "m+n"), "verified"),
    (HALF, Rewrite("p", 4, "m/n", {"m": 1, "n": 2}, "m+n"), "integer_mismatch"),
    (HALF, Rewrite("p", 6, "m/n", {"m": 2, "n": 4}, "m+n"), "parameters_not_coprime"),
    (HALF, Rewrite("p", 5, "m/n", {"m": 2, "n": 3}, "m+n"), "form_value_differs_from_answer"),
    (2 * sympy.sqrt(3), Rewrite("p", 14, "a*sqrt(b)", {"a": 1, "b": 12}, "a+b"), "radicand_not_square_free"),
    (sympy.Integer(7), Rewrite("p", 7, "a+b", {"a": 3, "b": 4}, "a+b"), "form_not_unique"),
    (HALF, Rewrite("p", 3, "m/n", {"m": 1, "n": 2.5}, "m+n"), "parameter_not_integer"),
    (HALF, Rewrite("p", 3, "m/n", {"m": 1}, "m+n"), "parameters_mismatch"),
    (-HALF, Rewrite("p", 1, "m/n", {"m": -1, "n": 2}, "m+n"), "parameter_not_positive"),
    (HALF, Rewrite("p", 3, "__import__('os').system('true')", {}, "1"), "unparsable_form"),
    (HALF, Rewrite("p", 3, "m/n", {"m": 1, "n": 2}, "m+n+q"), "target_uses_unknown_parameter"),
    (HALF, Rewrite("p", 3, "\\frac{m}{n}", {"m": 1, "n": 2}, "m+n"), "verified"),
    (11 - 2 * sympy.sqrt(6), Rewrite("p", 19, "k-m*sqrt(n)", {"k": 11, "m": 2, "n": 6}, "k+m+n"), "verified"),
    (sympy.Integer(-5), Rewrite("p", -5, "n", {"n": -5}, "n"), "verified"),
]


@pytest.mark.parametrize("value,rewrite,reason", VERIFY_TABLE)
def test_verifier(value: sympy.Expr, rewrite: Rewrite, reason: str) -> None:
    ok, why = verify_rewrite(value, rewrite)
    assert why.split(":")[0] == reason
    assert ok == (reason == "verified")


@pytest.mark.parametrize(
    "text", ["os.system('x')", "a.b", "lambda: 1", "[1]", "2**99999", "f(x)", "x if y else z"]
)
def test_form_parser_refuses_anything_but_arithmetic(text: str) -> None:
    with pytest.raises(FormError):
        parse_expression(text)


def test_gsm8k_answer_and_text_normalisation() -> None:
    assert gsm8k_final_answer("48/2 = 24\n#### 1,072") == "1072"
    assert repair_text("  A\u00a0 problem\r\n\n\nwith  spaces\x07 ") == "A\u00a0 problem\n\n\nwith  spaces"
    assert match_key("Find $\\dfrac{1}{2}$!") == match_key("find \\frac{1}{2}")


def _rows(pairs: list[tuple[str, str]]) -> list[dict]:
    return [
        {"id": f"t:{i}", "source": "t", "row": i, "problem": p, "answer": a} for i, (p, a) in enumerate(pairs)
    ]


def test_exact_and_near_duplicates() -> None:
    long = (
        "A bag holds red and blue marbles in the ratio three to five and there are forty marbles in the "
        "bag in all. "
    )
    rows = _rows(
        [
            (long + "How many are red?", "15"),
            (long.upper() + "How many are red?", "15"),  # exact up to case: dropped
            ("What is 2+2?", "4"),
            ("what is  2+2?", "5"),  # conflicting answers: both dropped
            (long + "How many are red ?", "15"),  # near, same answer: dropped
            (long + "How many are blue?", "25"),  # near, different answer: kept and reported
        ]
    )
    kept, dropped, report = exact_duplicates(rows)
    assert {d["id"]: d["reason"] for d in dropped} == {
        "t:1": "exact_duplicate",
        "t:2": "conflicting_answers",
        "t:3": "conflicting_answers",
    }
    assert report["conflicting_clusters"] == 1
    kept, dropped, report = near_duplicates(kept, threshold=0.7)
    assert [d["id"] for d in dropped] == ["t:4"]
    assert [r["id"] for r in kept] == ["t:0", "t:5"] and report["conflicting_clusters"] == 1


def test_decontamination_exact_and_near() -> None:
    eval_problem = (
        "Cities A and B are 45 miles apart. Alicia bikes towards B at 18 miles per hour and Beth bikes "
        "toward A at 12 miles per hour. How many miles from City A will they be when they meet?"
    )
    index = ContaminationIndex({"amc23": [{"id": "0", "problem": eval_problem}]})
    rows = _rows(
        [
            ("$" + eval_problem.replace("45", "$45$") + "$", "27"),  # same letters and digits: exact
            ("Note: " + eval_problem.replace("12 miles", "13 miles"), "26"),  # most 30-grams shared: near
            ("What is the sum of the first 45 positive odd integers?", "2025"),
        ]
    )
    kept, dropped, report = decontaminate(rows, index)
    assert [d["reason"] for d in dropped] == ["contaminated_exact", "contaminated_near"]
    assert dropped[1]["matches"][0]["overlap"] >= 0.6
    assert [r["id"] for r in kept] == ["t:2"]
    assert report["per_eval_set"]["amc23"]["eval_problems_exact"] == 1


@pytest.mark.parametrize(
    "source, exported",
    [
        (
            "rm \x0crac{m}{n} and \x0corall x",
            "rm \\frac{m}{n} and \\forall x",
        ),  # "\frac" read as form feed + "rac"
        (
            "$A_1P=\x08eta$, \x08egin{cases}",
            "$A_1P=\\beta$, \\begin{cases}",
        ),  # "\beta" read as backspace + "eta"
        ("a\r\nb\rc", "a\nb\nc"),  # line endings
        ("fi\x0cnd $x \\le\x14 2$, the \x0cfirst", "find $x \\le 2$, the first"),  # other control characters
        ("  \n Find x.\n\n ", "Find x."),  # outer whitespace
        (
            "①②③ =0\\quad① ＡＢ  two  spaces\n\n\n\nlines",
            "①②③ =0\\quad① ＡＢ  two  spaces\n\n\n\nlines",
        ),  # no NFKC
    ],
)
def test_repairs_are_the_documented_list_and_nothing_else(source: str, exported: str) -> None:
    assert repair_text(source) == exported
