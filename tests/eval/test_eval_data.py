"""The shipped eval sets, custom files, prompt templates and the stage config."""

from __future__ import annotations

import json
import re

import pytest

from dapo_suite.core.problems import BENCHMARKS, benchmark_path
from eval.config import EvalConfig
from eval.data import load_problems
from eval.prompts import DAPO_TEMPLATE, format_prompt


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_shipped_benchmarks(name):
    rows = [json.loads(line) for line in benchmark_path(name).read_text().splitlines()]
    assert len(rows) == BENCHMARKS[name][0]
    assert len({r["id"] for r in rows}) == len(rows)
    assert all(isinstance(r["answer"], str) and r["answer"] and r["problem"] for r in rows)
    if name != "math500":
        assert all(re.fullmatch(r"-?\d+", r["answer"]) for r in rows)
    else:
        assert all({"subject", "level"} <= set(r) for r in rows)


def test_shipped_answers_match_the_sources(raw_data_dir):
    aime = {
        r["id"]: str(r["answer"])
        for r in map(json.loads, open(raw_data_dir / "aime24/test.normalized.jsonl"))
    }
    assert {p.id: p.answer for p in load_problems("aime24")} == aime
    assert load_problems("aime24")[7].answer == "197"  # 2024 I #8, wrong in some public copies
    raw = [json.loads(line) for line in open(raw_data_dir / "gsm8k/test.jsonl")]
    gsm = load_problems("gsm8k")
    assert [p.answer for p in gsm] == [r["answer"].split("####")[-1].strip().replace(",", "") for r in raw]
    assert gsm[0].problem == raw[0]["question"] and gsm[0].answer == "18"
    math500 = load_problems("math500")
    assert math500[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)" and math500[0].extra["level"] == 2


def test_custom_jsonl_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    # parquet stores the answers as strings (verl style); jsonl answers may be numbers (AMC: 27.0)
    rows = [
        {"q": "1+1?", "reward_model": {"ground_truth": "2"}},
        {"q": "2+2?", "reward_model": {"ground_truth": "4"}},
    ]
    jsonl = tmp_path / "set.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "set.parquet")
    for path in (jsonl, tmp_path / "set.parquet"):
        problems = load_problems(file=str(path), problem_key="q", answer_key="reward_model.ground_truth")
        assert [(p.id, p.problem, p.answer) for p in problems] == [("0", "1+1?", "2"), ("1", "2+2?", "4")]
    with pytest.raises(ValueError, match="has no field 'problem'.*--problem-key"):
        load_problems(file=str(jsonl))
    assert len(load_problems("gsm8k", limit=5)) == 5


def test_dapo_template_is_the_papers():
    prompt = format_prompt("What is $\\frac{1}{2}$ of {x}?")
    assert prompt.startswith("Solve the following math problem step by step. The last line of your response")
    assert "What is $\\frac{1}{2}$ of {x}?" in prompt
    assert prompt.endswith('Remember to put your answer on its own line after "Answer:".')
    assert format_prompt("P", DAPO_TEMPLATE) == format_prompt("P", "dapo")
    assert format_prompt("P", "Q: {problem} A:") == "Q: P A:"
    with pytest.raises(ValueError, match="neither a known template"):
        format_prompt("P", "no field")


def test_config_defaults_are_the_dapo_protocol():
    c = EvalConfig()
    assert (c.benchmark, c.n, c.temperature, c.top_p, c.max_tokens, c.template, c.chat_template) == (
        "aime24",
        32,
        1.0,
        0.7,
        20480,
        "dapo",
        True,
    )
    assert c.model is None and c.engine == "auto"


def test_config_yaml_and_overrides(tmp_path):
    path = tmp_path / "eval.yaml"
    path.write_text("eval:\n  benchmark: gsm8k\n  n: 4\n  max_tokens: 256\n")
    c = EvalConfig.from_yaml(path, n=8)
    assert (c.benchmark, c.n, c.max_tokens, c.top_p) == ("gsm8k", 8, 256, 0.7)
    path.write_text("samples: 4\n")
    with pytest.raises(ValueError, match="Unknown eval setting"):
        EvalConfig.from_yaml(path)


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"n": 0}, "at least 1"),
        ({"top_p": 0}, "top_p"),
        ({"engine": "tgi"}, "choose one of"),
        ({"engine": "openai"}, "needs --endpoint"),
        ({"endpoint": "http://x", "engine": "hf"}, "drop --engine"),
    ],
)
def test_config_rejects_impossible_values(bad, message):
    with pytest.raises(ValueError, match=message):
        EvalConfig(**bad)
