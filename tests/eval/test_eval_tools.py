"""`dapo-suite eval --tools python`: the tool loop with the sandbox on a benchmark; each call is recorded in
generations.jsonl, tool statistics sit beside avg@k, and a rerun resumes; the endpoint refuses it clearly."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dapo_suite.core.sandbox import isolation


def dapo_suite(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", *args], capture_output=True, text=True, timeout=900
    )


def test_eval_with_the_python_tool_records_calls_and_reports_them(tmp_path):
    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    problems = tmp_path / "sums.jsonl"
    problems.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "problem": f"Compute {a} * {b}.", "answer": str(a * b)}) + "\n"
            for i, (a, b) in enumerate([(23, 41), (17, 19), (36, 12)])
        )
    )
    out = tmp_path / "run"
    args = [
        "eval",
        "--file",
        str(problems),
        "--tools",
        "python",
        "--n",
        "4",
        "--max-tokens",
        "96",
        "--out",
        str(out),
    ]
    result = dapo_suite(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tools:" in result.stdout and "calls a response" in result.stdout
    records = [json.loads(line) for line in (out / "generations.jsonl").read_text().splitlines()]
    assert len(records) == 12 and all("tool_calls" in r and "model_text" in r for r in records)
    calls = [call for r in records for call in r["tool_calls"]]
    assert calls, "the model wrote no code block in 12 samples"
    assert all(set(call) >= {"code", "outcome", "output"} for call in calls)
    for r in records:  # what the model was shown is in the text (cut where the budget ended)
        for call in r["tool_calls"]:
            assert call["output"][:10] in r["text"]
    tools = json.loads((out / "results.json").read_text())["tools"]
    assert tools["calls_per_response"] == len(calls) / 12
    again = dapo_suite(*args)
    assert again.returncode == 0 and "All 12 samples are on disk" in again.stdout


def test_tools_with_an_endpoint_are_refused_with_what_to_do(tmp_path):
    result = dapo_suite(
        "eval",
        "aime24",
        "--tools",
        "python",
        "--endpoint",
        "http://127.0.0.1:9/v1",
        "--out",
        str(tmp_path / "x"),
    )
    assert result.returncode != 0 and "--tools python runs with the hf engine" in result.stderr
    assert "Traceback" not in result.stderr
