"""Rewrite faithfulness: an LLM rewrite must be the original problem with a new question about the same
quantity. A scripted OpenAI-compatible server plays a rewriter that tampers in one way per test (fault
injection: a real model cannot be made to tamper on purpose); `dapo-suite data build --rewriter llm` runs in a
subprocess against it, and every tampered rewrite must end in rejected.jsonl with its reason, while the
faithful control is exported."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from dapo_suite.testing.scripted_server import ScriptedServer
from data_pipeline.faithful import check_faithful
from data_pipeline.forms import Rewrite

# (problem, original answer, m, n): answers m/n in lowest terms, so the AIME-style target is m + n.
PROBLEMS = [
    (
        "A bag holds 3 red and 5 blue marbles. Two marbles are drawn without replacement. What is the "
        "probability that both are red? Express your answer as a common fraction.",
        "\\frac{3}{28}",
        3,
        28,
    ),
    (
        "A fair coin is flipped 3 times. Each flip lands heads or tails with equal chance. What is the "
        "probability of exactly two heads? Express your answer as a common fraction.",
        "\\frac{3}{8}",
        3,
        8,
    ),
    (
        "A rectangle has width 2 and length 5. A square has side 3. What is the ratio of the rectangle's "
        "area to the square's area? Express your answer as a common fraction.",
        "\\frac{10}{9}",
        10,
        9,
    ),
]
# Numbers only as words, and a body-less problem (one question): only the numbers can tell a changed problem
# apart
WORD_PROBLEMS = [
    (
        "If two fair dice are rolled, what is the probability that the sum is seven? Express your answer as "
        "a common fraction.",
        "\\frac{1}{6}",
        1,
        6,
    ),
    (
        "A jar holds twelve marbles, and one third of them are green. Two marbles are drawn at random. What "
        "is the probability that both are green? Express your answer as a common fraction.",
        "\\frac{1}{11}",
        1,
        11,
    ),
]
ASK = (
    "The answer can be written as $\\frac{{m}}{{n}}$, where $m$ and $n$ are relatively prime positive "
    "integers. Find ${target}$."
)
OBSOLETE = " Express your answer as a common fraction."


def faithful(problem: str) -> str:
    return problem.replace(OBSOLETE, "") + " " + ASK.format(target="m+n")


def other_numbers(problem: str) -> str:
    return faithful(problem).replace(" 3 ", " 4 ", 1)


def dropped_condition(problem: str) -> str:
    first, second, rest = problem.split(". ", 2)
    return faithful(f"{first}. {rest}")


def unrelated(problem: str) -> str:
    return "What is 17 + 32? " + ASK.format(target="m+n")


def other_target(problem: str) -> str:
    return problem.replace(OBSOLETE, "") + " " + ASK.format(target="m \\cdot n")


def unchanged(problem: str) -> str:
    """The original word for word, still asking for a common fraction, while the record's answer is m+n."""
    return problem


def kept_instruction(problem: str) -> str:
    return problem + " " + ASK.format(target="m+n")


NEW_NUMBERS = {
    "3": "4",
    "5": "6",
    "2": "7",
    "Two": "Three",
    "two": "three",
    "seven": "eight",
    "twelve": "ten",
    "one third": "one half",
}


def every_number_changed(problem: str) -> str:
    """Every number of the problem changed, digits and words alike."""
    pattern = re.compile(r"\b(?:" + "|".join(sorted(NEW_NUMBERS, key=len, reverse=True)) + r")\b")
    return faithful(pattern.sub(lambda m: NEW_NUMBERS[m.group(0)], problem))


def rewriter(tamper: Callable[[str], str], problems: list = PROBLEMS) -> Callable[[dict], str]:
    """The scripted rewriter: reads the problem from the request and answers with a JSON rewrite whose form,
    parameters and target are right for the *original* answer (so only the text can give it away)."""

    def reply(body: dict) -> str:
        asked = body["messages"][-1]["content"]
        problem = re.search(r"Problem: (.*)\nOriginal answer:", asked, re.DOTALL).group(1)
        _, _, m, n = next(row for row in problems if row[0] == problem)
        return json.dumps(
            {
                "problem": tamper(problem),
                "answer": m + n,
                "form": "m/n",
                "params": {"m": m, "n": n},
                "target": "m+n",
            }
        )

    return reply


def build(
    tmp_path: Path, tamper: Callable[[str], str], problems: list = PROBLEMS
) -> tuple[subprocess.CompletedProcess, Path]:
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a, _, _ in problems))
    out = tmp_path / "build"
    with ScriptedServer(reply=rewriter(tamper, problems)) as server:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "dapo_suite.cli",
                "data",
                "build",
                "--input",
                str(raw),
                "--rewriter",
                "llm",
                "--base-url",
                server.base_url,
                "--model",
                "scripted",
                "--decontaminate",
                "",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    return result, out


def rejected_reasons(out: Path) -> list[str]:
    rows = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    return [row["reason"].split(":")[0] for row in rows]


def test_faithful_rewrites_are_exported(tmp_path: Path) -> None:
    result, out = build(tmp_path, faithful, PROBLEMS + WORD_PROBLEMS)
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(out / "train.parquet")
    assert len(frame) == 5 and frame["extra_info"].map(lambda e: e["verified"]).all()
    assert sorted(int(r["ground_truth"]) for r in frame["reward_model"]) == [7, 11, 12, 19, 31]
    assert "same problem" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    "tamper,reason",
    [
        (other_numbers, "rewrite_numbers_changed"),
        (dropped_condition, "rewrite_dropped_condition"),
        (unrelated, "rewrite_changed_problem"),
        (other_target, "rewrite_asks_other_target"),
        (unchanged, "rewrite_asks_for_non_integer"),
        (kept_instruction, "rewrite_asks_for_non_integer"),
    ],
)
def test_tampered_rewrites_are_rejected_with_their_reason(tmp_path: Path, tamper, reason) -> None:
    result, out = build(tmp_path, tamper)
    reasons = rejected_reasons(out)
    expected = 2 if tamper is other_numbers else 3  # only two problems hold " 3 " to change
    assert reasons.count(reason) == expected, (reasons, result.stderr[-2000:])
    assert not (out / "train.parquet").exists() or len(pd.read_parquet(out / "train.parquet")) == 3 - expected
    stats = json.loads((out / "stats.json").read_text())
    # every rejection is counted by its reason: the ledger, rejected.jsonl and the dataset card agree
    assert stats["ledger"]["dropped"].get(reason) == expected and stats["ledger"]["balanced"]
    assert f'"{reason}": {expected}' in (out / "README.md").read_text()


def test_a_rewrite_with_every_number_changed_is_rejected_whatever_the_notation(tmp_path: Path) -> None:
    """Digits, `one third`, `twelve`, `seven`: problems whose numbers are all words and that have no statement
    before their question (so no sentence comparison sees them) are caught by their numbers."""
    result, out = build(tmp_path, every_number_changed, PROBLEMS + WORD_PROBLEMS)
    assert rejected_reasons(out).count("rewrite_numbers_changed") == 5, (
        rejected_reasons(out),
        result.stderr[-2000:],
    )
    assert not (out / "train.parquet").exists() or len(pd.read_parquet(out / "train.parquet")) == 0


def test_one_prompt_never_carries_two_answers(tmp_path: Path) -> None:
    """Two source rows that differ only in an instruction the rewrite drops become one text: with different
    answers both go (conflict), with the same answer the copy goes."""
    raw = tmp_path / "raw.jsonl"
    question = "What is $\\frac{1}{2} + \\frac{1}{4}$?"
    rows = [
        (question + " Express your answer as a common fraction.", "\\frac{3}{4}"),
        (question + " Express the answer in lowest terms.", "\\frac{5}{4}"),
        ("What is $\\frac{1}{3}$ of 1? Express your answer as a common fraction.", "\\frac{1}{3}"),
        ("What is $\\frac{1}{3}$ of 1? Give your answer as a fraction.", "\\frac{1}{3}"),
    ]
    raw.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in rows))
    out = tmp_path / "build"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_suite.cli",
            "data",
            "build",
            "--input",
            str(raw),
            "--decontaminate",
            "",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert sorted(rejected_reasons(out)) == [
        "rewrite_duplicate",
        "rewrite_duplicate_conflict",
        "rewrite_duplicate_conflict",
    ]
    assert len(pd.read_parquet(out / "train.parquet")) == 1


def test_rule_rewrites_of_decimals_ask_for_the_scaled_answer() -> None:
    problem = "A coin weighs 2.5 grams. How many grams do 3 coins weigh?"
    ok = Rewrite(problem + " If the answer is $x$, find $10x$.", 75, "n/10", {"n": 75}, "n")
    assert check_faithful(problem, ok) == (True, "ok")
    wrong = Rewrite(problem + " If the answer is $x$, find $100x$.", 75, "n/10", {"n": 75}, "n")
    assert check_faithful(problem, wrong)[1].startswith("rewrite_asks_other_target")


def _check(original: str, answer: str, problem: str, form: str, params: dict[str, int], target: str) -> str:
    """check_faithful's verdict ("ok" or the reason's kind) on a rewrite that `verify_rewrite` proves."""
    from data_pipeline.answers import analyse_answer
    from data_pipeline.forms import verify_rewrite

    rewrite = Rewrite(
        problem, sum(params.values()) if "+" in target else params[target], form, params, target, "llm"
    )
    assert verify_rewrite(analyse_answer(answer).value, rewrite) == (True, "verified")
    return check_faithful(original, rewrite)[1].split(":")[0]


PROBABILITY = (
    "A box holds three red balls and four green balls. One ball is drawn at random. Find the probability "
    "that it is red. Express as a common fraction."
)
PROBABILITY_BODY = "A box holds three red balls and four green balls. One ball is drawn at random."


@pytest.mark.parametrize(
    "problem,verdict",
    [
        # faithful, with the form and the ask in plain text or LaTeX, and the numbers in another notation
        (PROBABILITY_BODY + " The probability that it is red is m/n in lowest terms; find m+n.", "ok"),
        (
            PROBABILITY_BODY
            + " If the probability that it is red is $\\dfrac{m}{n}$ with $\\gcd(m,n)=1$, what is $m + n$?",
            "ok",
        ),
        (
            "A box holds 3 red balls and 4 green balls. 1 ball is drawn at random. The probability that it "
            "is red is $\\frac{m}{n}$, where $m$ and $n$ are relatively prime positive integers. Find $m+n$.",
            "ok",
        ),
        # still asks for the probability: the original word for word, its instruction kept, the form itself
        # asked for
        (PROBABILITY, "rewrite_asks_for_non_integer"),
        (PROBABILITY + " The probability is m/n in lowest terms; find m+n.", "rewrite_asks_for_non_integer"),
        (PROBABILITY_BODY + " Find the probability that it is red.", "rewrite_asks_for_non_integer"),
        (
            PROBABILITY_BODY + " The probability is $\\frac{m}{n}$ in lowest terms. Find $\\frac{m}{n}$.",
            "rewrite_asks_for_non_integer",
        ),
        # asks for m+n without saying what m and n are
        (PROBABILITY_BODY + " Find $m+n$.", "rewrite_asks_other_target"),
        # numbers changed, in words, in digits, or swapped between their places
        (
            "A box holds five red balls and two green balls. One ball is drawn at random. The probability "
            "that it is red is m/n in lowest terms; find m+n.",
            "rewrite_numbers_changed",
        ),
        (
            "A box holds 3 red balls and 5 green balls. One ball is drawn at random. The probability that it "
            "is red is m/n in lowest terms; find m+n.",
            "rewrite_numbers_changed",
        ),
        (
            "A box holds four red balls and three green balls. One ball is drawn at random. The probability "
            "that it is red is m/n in lowest terms; find m+n.",
            "rewrite_numbers_changed",
        ),
    ],
)
def test_a_probability_rewrite_asks_for_the_integer_and_keeps_every_number(
    problem: str, verdict: str
) -> None:
    assert _check(PROBABILITY, "\\frac{3}{7}", problem, "m/n", {"m": 3, "n": 7}, "m+n") == verdict


FRACTION = (
    "What is $\\frac{1}{2}$ of $\\dfrac{3}{5}$ of one half of 10? Express your answer as a common fraction."
)


@pytest.mark.parametrize(
    "problem,verdict",
    [
        (
            "What is $\\frac{1}{2}$ of $\\dfrac{3}{5}$ of one half of 10? The answer is $\\frac{p}{q}$ in "
            "lowest terms. Find $p+q$.",
            "ok",
        ),
        (
            "What is one half of three fifths of 1/2 of ten? The answer is $\\frac{p}{q}$ in lowest terms. "
            "Find $p+q$.",
            "ok",
        ),
        (FRACTION, "rewrite_asks_for_non_integer"),
        (
            "What is $\\frac{1}{3}$ of $\\dfrac{3}{4}$ of one third of 12? The answer is $\\frac{p}{q}$ in "
            "lowest terms. Find $p+q$.",
            "rewrite_numbers_changed",
        ),
    ],
)
def test_a_fraction_rewrite_keeps_its_numbers_in_any_notation(problem: str, verdict: str) -> None:
    assert _check(FRACTION, "\\frac{3}{2}", problem, "p/q", {"p": 3, "q": 2}, "p+q") == verdict


RADICAL = "Simplify $\\sqrt{50}+\\sqrt{18}$. Express your answer in simplest radical form."


@pytest.mark.parametrize(
    "problem,verdict",
    [
        (
            "Simplify $\\sqrt{50}+\\sqrt{18}$. The answer is of the form $a\\sqrt{b}$, where $a$ and $b$ are "
            "positive integers and $b$ is not divisible by the square of any prime; find $a+b$.",
            "ok",
        ),
        (
            "Simplify $\\sqrt{50}+\\sqrt{18}$. It is of the form $a\\sqrt b$ with $b$ square-free; find a+b.",
            "ok",
        ),
        (RADICAL, "rewrite_asks_for_non_integer"),
        (
            "Simplify $\\sqrt{50}+\\sqrt{18}$. The answer is $a\\sqrt{b}$ with $b$ square-free. Find "
            "$a\\sqrt{b}$.",
            "rewrite_asks_for_non_integer",
        ),
        (
            "Simplify $\\sqrt{32}+\\sqrt{8}$. The answer is of the form $a\\sqrt{b}$, where $a$ and $b$ are "
            "positive integers and $b$ is square-free; find $a+b$.",
            "rewrite_numbers_changed",
        ),
    ],
)
def test_a_radical_rewrite_asks_for_the_sum_of_its_parameters(problem: str, verdict: str) -> None:
    assert _check(RADICAL, "8\\sqrt{2}", problem, "a*sqrt(b)", {"a": 8, "b": 2}, "a+b") == verdict


def test_an_integer_answer_may_keep_the_problem_unchanged() -> None:
    problem = "Two fair dice are rolled. In how many outcomes is the sum seven?"
    assert check_faithful(problem, Rewrite(problem, 6, "n", {"n": 6}, "n")) == (True, "ok")
