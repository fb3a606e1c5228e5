"""Rewrite faithfulness: an LLM rewrite must be the original problem with a new question about the same quantity.
A scripted OpenAI-compatible server plays a rewriter that tampers in one way per test (fault injection: a real
model cannot be made to tamper on purpose); `dapo-suite data build --rewriter llm` runs in a subprocess against it,
and every tampered rewrite must end in rejected.jsonl with its reason, while the faithful control is exported."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from scripted_server import ScriptedServer

from data_pipeline.faithful import check_faithful
from data_pipeline.forms import Rewrite

# (problem, original answer, m, n): answers m/n in lowest terms, so the AIME-style target is m + n.
PROBLEMS = [
    ("A bag holds 3 red and 5 blue marbles. Two marbles are drawn without replacement. What is the probability "
     "that both are red? Express your answer as a common fraction.", "\\frac{3}{28}", 3, 28),
    ("A fair coin is flipped 3 times. Each flip lands heads or tails with equal chance. What is the probability "
     "of exactly two heads? Express your answer as a common fraction.", "\\frac{3}{8}", 3, 8),
    ("A rectangle has width 2 and length 5. A square has side 3. What is the ratio of the rectangle's area to "
     "the square's area? Express your answer as a common fraction.", "\\frac{10}{9}", 10, 9),
]
ASK = ("The answer can be written as $\\frac{{m}}{{n}}$, where $m$ and $n$ are relatively prime positive "
       "integers. Find ${target}$.")
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


def rewriter(tamper: Callable[[str], str]) -> Callable[[dict], str]:
    """The scripted rewriter: reads the problem from the request and answers with a JSON rewrite whose form,
    parameters and target are right for the *original* answer (so only the text can give it away)."""
    def reply(body: dict) -> str:
        asked = body["messages"][-1]["content"]
        problem = re.search(r"Problem: (.*)\nOriginal answer:", asked, re.DOTALL).group(1)
        _, _, m, n = next(row for row in PROBLEMS if row[0] == problem)
        return json.dumps({"problem": tamper(problem), "answer": m + n, "form": "m/n", "params": {"m": m, "n": n},
                           "target": "m+n"})
    return reply


def build(tmp_path: Path, tamper: Callable[[str], str]) -> tuple[subprocess.CompletedProcess, Path]:
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a, _, _ in PROBLEMS))
    out = tmp_path / "build"
    with ScriptedServer(reply=rewriter(tamper)) as server:
        result = subprocess.run(
            [sys.executable, "-m", "dapo_suite.cli", "data", "build", "--input", str(raw), "--rewriter", "llm",
             "--base-url", server.base_url, "--model", "scripted", "--decontaminate", "", "--out", str(out)],
            capture_output=True, text=True, timeout=300)
    return result, out


def rejected_reasons(out: Path) -> list[str]:
    rows = [json.loads(line) for line in (out / "rejected.jsonl").read_text().splitlines()]
    return [row["reason"].split(":")[0] for row in rows]


def test_faithful_rewrites_are_exported(tmp_path: Path) -> None:
    result, out = build(tmp_path, faithful)
    assert result.returncode == 0, result.stderr
    frame = pd.read_parquet(out / "train.parquet")
    assert len(frame) == 3 and frame["extra_info"].map(lambda e: e["verified"]).all()
    assert sorted(int(r["ground_truth"]) for r in frame["reward_model"]) == [11, 19, 31]
    assert "same problem" in (out / "README.md").read_text()


@pytest.mark.parametrize("tamper,reason", [
    (other_numbers, "rewrite_changed_problem"),
    (dropped_condition, "rewrite_dropped_condition"),
    (unrelated, "rewrite_changed_problem"),
    (other_target, "rewrite_asks_other_target"),
])
def test_tampered_rewrites_are_rejected_with_their_reason(tmp_path: Path, tamper, reason) -> None:
    result, out = build(tmp_path, tamper)
    reasons = rejected_reasons(out)
    expected = 2 if tamper is other_numbers else 3  # only two problems hold " 3 " to change
    assert reasons.count(reason) == expected, (reasons, result.stderr[-2000:])
    assert not (out / "train.parquet").exists() or len(pd.read_parquet(out / "train.parquet")) == 3 - expected
    stats = json.loads((out / "stats.json").read_text())
    assert reason in json.dumps(stats["ledger"])


def test_one_prompt_never_carries_two_answers(tmp_path: Path) -> None:
    """Two source rows that differ only in an instruction the rewrite drops become one text: with different
    answers both go (conflict), with the same answer the copy goes."""
    raw = tmp_path / "raw.jsonl"
    question = "What is $\\frac{1}{2} + \\frac{1}{4}$?"
    rows = [(question + " Express your answer as a common fraction.", "\\frac{3}{4}"),
            (question + " Express the answer in lowest terms.", "\\frac{5}{4}"),
            ("What is $\\frac{1}{3}$ of 1? Express your answer as a common fraction.", "\\frac{1}{3}"),
            ("What is $\\frac{1}{3}$ of 1? Give your answer as a fraction.", "\\frac{1}{3}")]
    raw.write_text("".join(json.dumps({"problem": p, "answer": a}) + "\n" for p, a in rows))
    out = tmp_path / "build"
    result = subprocess.run([sys.executable, "-m", "dapo_suite.cli", "data", "build", "--input", str(raw),
                             "--decontaminate", "", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert sorted(rejected_reasons(out)) == ["rewrite_duplicate", "rewrite_duplicate_conflict",
                                             "rewrite_duplicate_conflict"]
    assert len(pd.read_parquet(out / "train.parquet")) == 1


def test_rule_rewrites_of_decimals_ask_for_the_scaled_answer() -> None:
    problem = "A coin weighs 2.5 grams. How many grams do 3 coins weigh?"
    ok = Rewrite(problem + " If the answer is $x$, find $10x$.", 75, "n/10", {"n": 75}, "n")
    assert check_faithful(problem, ok) == (True, "ok")
    wrong = Rewrite(problem + " If the answer is $x$, find $100x$.", 75, "n/10", {"n": 75}, "n")
    assert check_faithful(problem, wrong)[1].startswith("rewrite_asks_other_target")
