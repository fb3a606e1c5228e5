"""The rule-based reward: DAPO's protocol, agreement with verl's math_dapo, symbolic grading, hostile input."""

from __future__ import annotations

import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import dapo_suite.reward as reward
from dapo_suite.reward import compute_score, extract_answer, parse_integer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.synthetic_responses import make_responses  # noqa: E402

math_dapo = pytest.importorskip("verl.utils.reward_score.math_dapo")


def score(text, truth):
    return compute_score("math_dapo", text, truth)


@pytest.mark.parametrize(
    "answer",
    ["Answer: 42", "Answer: $042$", "\\boxed{42}", "Answer: 42.0", "Answer: 4{,}2", "Answer: x = 42",
     "Answer: **42**", "Answer: 42 \\text{ cm}", "answer:42", "Answer:\n42", "Answer: $\\boxed{42}$.",
     "Answer: The answer is $42$.", "Answer: 42 apples", "Answer: \\(42\\)", "Answer: 42^\\circ", "Answer: \\mbox{42}"],
)
def test_integer_forms_read_as_the_number(answer):
    assert score("Some reasoning.\n" + answer, "42") == {"score": 1.0, "acc": True, "pred": extract_answer(answer)}


@pytest.mark.parametrize(
    "answer",
    ["Answer: 42 or 43", "Answer: 2x", "Answer: 9^9^9^9", "Answer: 41", "Answer: 42.5", "Answer: \\frac{84}{2}",
     "Answer: 42, 43", "Answer: $42$ or $43$", "Answer: 6 \\cdot 7", "Answer: 42 (or maybe 43)", "no answer here"],
)
def test_hedges_expressions_and_wrong_numbers_score_minus_one(answer):
    result = score("Reasoning.\n" + answer, "42")
    assert result["score"] == -1.0 and result["acc"] is False


def test_negative_and_large_integers():
    assert score("Answer: -7", "-7")["acc"]
    assert score("Answer: \u22127", "-7")["acc"]  # typeset minus sign
    assert not score("Answer: 7", "-7")["acc"]
    assert score("Answer: 1,000,000", "1000000")["acc"]
    assert parse_integer("12345678901234567890") == 12345678901234567890


def test_last_answer_line_wins_and_boxed_is_the_fallback():
    assert score("Answer: 41\nWait, let me re-check.\nAnswer: 42", "42")["acc"]
    assert score("I think \\boxed{41} at first, then \\boxed{42}", "42")["acc"]
    assert score("Answer: 42\n\\boxed{41}", "42")["acc"]  # an Answer: line beats a box
    assert score("\\boxed{42", "42")["pred"] is None  # unclosed box: no answer


def test_answer_is_read_from_the_last_300_characters_only():
    # The protocol puts the answer on the last line; verl's math_dapo reads the same window.
    assert score("Answer: 42\n" + "x" * 400, "42") == {"score": -1.0, "acc": False, "pred": None}
    assert compute_score("s", "Answer: 42\n" + "x" * 400, "42", answer_window=1000)["acc"]


@pytest.mark.parametrize(
    "pred, truth, expected",
    [("\\dfrac{1}{2}", "\\frac12", True), ("0.5", "\\frac{1}{2}", True), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt2}", True),
     ("3\\sqrt{2}", "\\sqrt{18}", True), ("(1, 2)", "(1,2)", True), ("[1, 2)", "[1,2)", True), ("x^2+2x+1", "(x+1)^2", True),
     ("2\\pi", "2 \\pi", True), ("\\frac{1}{3}", "\\frac{1}{2}", False), ("(1, 3)", "(1, 2)", False), ("[1, 2]", "[1, 2)", False)],
)
def test_symbolic_equivalence_for_non_integer_ground_truths(pred, truth, expected):
    assert score(f"Answer: {pred}", truth)["acc"] is expected


def test_exact_rationals_are_compared_exactly():
    # math-verify compares numerically and calls 1/2004! equal to 1/2006! (a known false positive).
    assert not score("Answer: \\frac{1}{2004!}", "\\frac{1}{2006!}")["acc"]
    assert score("Answer: \\frac{2}{2006!}", "\\frac{4}{2 \\cdot 2006!}")["acc"]


def test_symbolic_grading_works_off_the_main_thread():
    # verl's reward manager calls compute_score from an executor thread; math-verify's own timeout cannot.
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda p: score(f"Answer: {p}", "\\frac{1}{2}")["acc"], ["\\frac{2}{4}", "0.5", "1/3"] * 4))
    assert results == [True, True, False] * 4


def test_model_text_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    payloads = [f"__import__('os').system('touch {marker}')", f"exec(\"open('{marker}','w')\")",
                f"\\text{{__import__('os').system('touch {marker}')}}"]
    for payload in payloads:
        for truth in ("42", "\\frac{1}{2}", "x + 1"):
            assert score(f"Answer: {payload}", truth)["score"] == -1.0
    assert not marker.exists()


ADVERSARIAL = {
    "one megabyte": "a" * 1_000_000 + "\nAnswer: 42",
    "nested braces": "\\boxed{" + "{" * 1_000_000 + "}" * 1_000_000,
    "power tower": "Answer: 9^9^9^9",
    "braced power tower": "Answer: 9^{9^{9^{9}}}",
    "factorial tower": "Answer: ((10^{10})!)!",
    "NUL bytes": "Answer: 4\x002\x00" + "\x00" * 1000,
    "lone surrogates": "Answer: \ud800\udfff42\udc00",
    "invalid UTF-8 bytes": b"Answer: \xff\xfe42\xc3\x28",
    "deep LaTeX": "Answer: " + "\\frac{1}{" * 120 + "2" + "}" * 120,
}


@pytest.mark.parametrize("truth", ["42", "\\frac{1}{2}"])
@pytest.mark.parametrize("name", list(ADVERSARIAL))
def test_adversarial_output_scores_within_a_second(name, truth):
    reward.SYMBOLIC_CHECKER.equivalent("1", "1")  # start the checker first: its start-up is not the input's cost
    start = time.monotonic()
    result = compute_score("math_dapo", ADVERSARIAL[name], truth)
    assert time.monotonic() - start < 1.0
    assert result["score"] in (1.0, -1.0)


def test_a_hung_comparison_is_killed_and_the_next_one_is_served():
    checker = reward.SymbolicChecker(timeout_s=0.3)
    try:
        assert checker.equivalent("\\frac{1}{2}", "0.5")
        start = time.monotonic()
        assert not checker.equivalent("\\frac{1}{2}", "9^{9^{9^{9}}}")
        assert time.monotonic() - start < 1.0
        assert checker.equivalent("\\frac{1}{2}", "\\frac{3}{6}")  # the standby took over
    finally:
        checker.close()


def test_a_thread_calling_during_a_hang_still_gets_an_answer():
    results = []
    threads = [threading.Thread(target=lambda t=t: results.append(score(f"Answer: {t}", "\\frac12")["acc"]))
               for t in ("9^{9^{9^{9}}}", "\\frac{1}{2}")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=5)
    assert sorted(results) == [False, True]


# Agreement with verl 0.9.1's math_dapo on integer ground truths, wherever math_dapo is right.

def test_agrees_with_math_dapo_wherever_it_is_right_on_realistic_responses():
    disagreements = []
    for text, truth in make_responses(20_000, seed=1):
        if math_dapo.compute_score(text, truth)["acc"] and not score(text, truth)["acc"]:
            disagreements.append((text[-80:], truth))
    assert disagreements == []


ANSWER_VARIANTS = [
    "{v}", "${v}$", "\\${v}", "{v} \\text{{students}}", "{v}students", "\\text{{{v}}}", "a {v}", "{v}^{{\\circ}}",
    "\\textbf{{{v}}}", "\\overline{{{v}}}", "{v}\\;", "\\mbox{{{v}}}", "$x={v}$", "{v}\\ldots", "\"{v}\"", "{v}.$",
    "{v} square units", "\\boxed{{{v}}}.", "{v}\\mathrm{{th}}", "{v} childrentickets", "{v} \\text{{ and }}",
]


@pytest.mark.parametrize("variant", ANSWER_VARIANTS)
def test_agrees_with_math_dapo_on_answer_variants(variant):
    for value in ("42", "1234", "-7", "0", "1,234", "100000"):
        text = "Answer: " + variant.format(v=value)
        for truth in ("42", "1234", "-7", "0", "100000"):
            if math_dapo.compute_score(text, truth)["acc"]:
                assert score(text, truth)["acc"], (text, truth)


# Deliberate differences from math_dapo: each is a case where math_dapo's string comparison is wrong.

def test_difference_zero_padded_answers_are_integers():
    # AIME answers are often written 042 (and Qwen's AIME file stores "025"); they are the integer 42.
    assert not math_dapo.compute_score("Answer: 042", "42")["acc"]
    assert score("Answer: 042", "42")["acc"] and score("Answer: 25", "025")["acc"]


def test_difference_integral_decimals_are_integers():
    assert not math_dapo.compute_score("Answer: 42.0", "42")["acc"]
    assert score("Answer: 42.0", "42")["acc"]


def test_difference_markdown_bold_is_formatting():
    assert not math_dapo.compute_score("Answer: **42**", "42")["acc"]
    assert score("Answer: **42**", "42")["acc"]


def test_difference_any_trailing_unit_word_is_allowed():
    # math_dapo strips only the units on its list ("dollars", "cm", ...); "apples" fails there.
    assert not math_dapo.compute_score("Answer: 42 apples", "42")["acc"]
    assert score("Answer: 42 apples", "42")["acc"]


def test_difference_hedged_answers_in_math_mode_are_wrong():
    # math_dapo keeps only the first $...$ span, so "$42$ or $43$" passes there; a hedge is not an answer.
    assert math_dapo.compute_score("Answer: $42$ or $43$", "42")["acc"]
    assert not score("Answer: $42$ or $43$", "42")["acc"]


def test_verl_loads_and_calls_it_as_its_custom_reward_function():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.reward import get_custom_reward_fn

    config = OmegaConf.create({"reward": {"custom_reward_function": {"path": reward.__file__, "name": "compute_score"}}})
    fn = get_custom_reward_fn(config)
    with ThreadPoolExecutor(1) as pool:  # verl runs it in an executor thread
        result = pool.submit(fn, data_source="math_dapo", solution_str="Answer: \\frac{2}{4}", ground_truth="\\frac12",
                             extra_info={"index": 3}).result()
    assert result == {"score": 1.0, "acc": True, "pred": "\\frac{2}{4}"}
