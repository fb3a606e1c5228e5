"""The OpenAI-endpoint engine against a real server (`transformers serve` with the embedded model on
127.0.0.1), and its retries against a scripted server that injects faults."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dapo_suite.cli import main
from dapo_suite.core.errors import UserError
from dapo_suite.core.ports import free_port
from dapo_suite.inference.engines import Request, Sampling
from dapo_suite.testing.scripted_server import ScriptedServer
from eval.engines import OpenAIEngine
from eval.scoring import read_generations


@pytest.fixture(scope="module")
def transformers_server():
    """`transformers serve` with the embedded model on a free port (serve's own launcher); stopped after the
    module."""
    from dapo_suite.inference.endpoint import start_endpoint

    with start_endpoint(None, engine="auto") as endpoint:
        yield endpoint.base_url, endpoint.model_name


@pytest.mark.slow
def test_eval_through_transformers_serve(transformers_server, tmp_path):
    base, model = transformers_server
    out = tmp_path / "run"
    result = CliRunner().invoke(
        main,
        [
            "eval",
            "gsm8k",
            "--endpoint",
            base,
            "--model",
            model,
            "--n",
            "2",
            "--limit",
            "2",
            "--max-tokens",
            "8",
            "--concurrency",
            "4",
            "--out",
            str(out),
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    records = read_generations(out / "generations.jsonl")
    assert sorted((r["problem_id"], r["sample_index"]) for r in records) == [
        ("gsm8k-test-0", 0),
        ("gsm8k-test-0", 1),
        ("gsm8k-test-1", 0),
        ("gsm8k-test-1", 1),
    ]
    for r in records:
        assert r["finish_reason"] in ("stop", "length") and 1 <= r["num_tokens"] <= 8 and r["text"]
    results = json.loads((out / "results.json").read_text())
    assert results["complete"] and results["num_samples"] == 4
    assert json.loads((out / "sessions.jsonl").read_text().splitlines()[0])["engine"] == "openai"


def test_retries_with_backoff_after_429_and_503():
    with ScriptedServer(script=["429", "503", "500"]) as server:
        engine = OpenAIEngine(server.base_url, concurrency=2, max_retries=4, backoff=0.01)
        assert engine.model == "scripted"  # taken from /v1/models
        done = []
        engine.generate([Request("p", i, "q", i) for i in range(4)], Sampling(1.0, 0.7, 16), done.append)
    assert sorted(c.sample_index for c in done) == [0, 1, 2, 3]
    assert all(c.text == "Answer: 42" and c.finish_reason == "stop" and c.num_tokens == 4 for c in done)
    assert (
        server.stats["requests"] == 7
        and server.stats["completed"] == 4
        and server.stats["max_in_flight"] <= 2
    )


def test_gives_up_with_a_clear_message():
    with ScriptedServer(script=["400"]) as server:
        engine = OpenAIEngine(server.base_url, model="scripted", max_retries=3, backoff=0.01)
        with pytest.raises(UserError, match=r"sample 0 of problem p .* failed after 1 attempt"):
            engine.generate([Request("p", 0, "q", 0)], Sampling(1.0, 0.7, 16), lambda c: None)
    with ScriptedServer(script=["503"] * 3) as server:
        engine = OpenAIEngine(server.base_url, model="scripted", max_retries=2, backoff=0.01)
        with pytest.raises(UserError, match="failed after 3 attempt"):
            engine.generate([Request("p", 0, "q", 0)], Sampling(1.0, 0.7, 16), lambda c: None)
        assert server.stats["requests"] == 3


def test_unreachable_endpoint_says_what_to_do():
    port = free_port()  # a port that nothing listens on
    with pytest.raises(RuntimeError, match="pass --model NAME"):
        OpenAIEngine(f"http://127.0.0.1:{port}")


def test_malformed_responses_are_retried_like_other_faults():
    with ScriptedServer(script=["malformed", "drop", "malformed"]) as server:
        engine = OpenAIEngine(server.base_url, model="scripted", concurrency=1, max_retries=3, backoff=0.01)
        done = []
        engine.generate([Request("p", 0, "q", 0)], Sampling(1.0, 0.7, 16), done.append)
    assert [c.text for c in done] == ["Answer: 42"] and server.stats["requests"] == 4


def test_giving_up_keeps_every_finished_sample_and_names_endpoint_and_request():
    # concurrency 1: samples 0 and 1 finish, sample 2 meets a malformed body every time
    with ScriptedServer(script=["ok", "ok"], default="malformed") as server:
        engine = OpenAIEngine(server.base_url, model="scripted", concurrency=1, max_retries=1, backoff=0.01)
        done = []
        with pytest.raises(UserError) as raised:
            engine.generate([Request("p", i, "q", i) for i in range(3)], Sampling(1.0, 0.7, 16), done.append)
    assert sorted(c.sample_index for c in done) == [0, 1]
    message = str(raised.value)
    assert server.base_url in message and "sample 2 of problem p" in message and "JSONDecodeError" in message
