"""`dapo-suite eval --tools python`: the tool loop with the sandbox on a benchmark; each call is recorded in
generations.jsonl, tool statistics sit beside avg@k, and a rerun resumes; over an endpoint the calls run
client-side and give what the embedded engine gives."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from toy import serve_api

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


def test_tools_with_the_vllm_engine_are_refused_with_what_to_do(tmp_path):
    result = dapo_suite(
        "eval", "aime24", "--tools", "python", "--engine", "vllm", "--out", str(tmp_path / "x")
    )
    assert result.returncode != 0 and "--tools python runs with the hf engine" in result.stderr
    assert "--endpoint URL" in result.stderr and "Traceback" not in result.stderr


def test_eval_over_the_endpoint_runs_the_tool_client_side_as_the_embedded_engine_does(tmp_path):
    """Greedy, float32 on both sides: `serve api` with the embedded model, eval's openai engine running each
    call in the sandbox here, and eval's hf engine in process give the same responses, calls and avg@k."""
    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    problems = tmp_path / "sums.jsonl"
    # phrasings under which the untrained model, greedy, writes code blocks (one, two, or a broken one)
    asks = [
        "Use Python to compute {} * {}.",
        "Write a ```python block that prints {} * {}, then give the answer.",
    ]
    asks.append("Compute {} * {} with a python code block.")
    pairs = [(ask, a, b) for ask in asks for a, b in [(23, 41), (17, 19)]]
    problems.write_text(
        "".join(
            json.dumps({"id": f"p{i}", "problem": ask.format(a, b), "answer": str(a * b)}) + "\n"
            for i, (ask, a, b) in enumerate(pairs)
        )
    )
    common = ["--file", str(problems), "--tools", "python", "--n", "1", "--temperature", "0"]
    common += ["--max-tokens", "160", "--dtype", "float32"]
    results = {}
    with serve_api("--dtype", "float32") as served:
        endpoint = dapo_suite("eval", *common, "--endpoint", served.base_url, "--out", str(tmp_path / "api"))
    assert endpoint.returncode == 0, endpoint.stderr[-3000:]
    embedded = dapo_suite("eval", *common, "--engine", "hf", "--out", str(tmp_path / "hf"))
    assert embedded.returncode == 0, embedded.stderr[-3000:]
    for name in ("api", "hf"):
        records = [
            json.loads(line) for line in (tmp_path / name / "generations.jsonl").read_text().splitlines()
        ]
        results[name] = (
            {r["problem_id"]: (r["text"], [c["output"] for c in r["tool_calls"]]) for r in records},
            json.loads((tmp_path / name / "results.json").read_text()),
        )
    (api_texts, api_results), (hf_texts, hf_results) = results["api"], results["hf"]
    assert any(calls for _, calls in hf_texts.values()), "the model called no tool: nothing was compared"
    assert api_texts == hf_texts
    assert api_results["tools"] == hf_results["tools"]
    assert api_results["avg@k"] == hf_results["avg@k"]
