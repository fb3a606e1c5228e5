"""The LLM rewriter over real HTTP: fault injection against a scripted server (429, 5xx, timeouts, malformed
bodies, dropped connections), kill-and-resume without repeated calls, and (slow) the whole build against
`transformers serve` running the embedded model."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dapo_suite.core.ports import free_port
from dapo_suite.testing.scripted_server import ScriptedServer
from data_pipeline.llm import LLMRewriter, RequestCache, parse_reply

ROOT = Path(__file__).resolve().parents[2]

REWRITE_REPLY = json.dumps(
    {"problem": "p", "answer": 3, "form": "m/n", "params": {"m": 1, "n": 2}, "target": "m+n"}
)


def test_parse_reply_takes_the_last_json_object_and_never_evaluates() -> None:
    reply = (
        'Step 1... {"x": 1}\n{"problem": "P", "answer": "19", "form": "k-m*sqrt(n)", "params": {"k": '
        '11}, "target": "k"}'
    )
    rewrite, reason = parse_reply(reply)
    assert reason == "ok" and rewrite.answer == 19 and rewrite.rewriter == "llm"
    assert parse_reply("The answer is 19.") == (None, "llm_malformed_json")
    assert parse_reply('{"problem": "P", "answer": 1.5}') == (None, "llm_answer_not_integer")


def test_retries_through_every_fault(tmp_path: Path) -> None:
    with ScriptedServer(
        reply=REWRITE_REPLY, script=["429", "500", "malformed", "drop", "timeout"], hang_s=2.0
    ) as server:
        rewriter = LLMRewriter(
            server.base_url,
            "m",
            tmp_path / "cache.jsonl",
            concurrency=1,
            timeout_s=0.5,
            max_retries=6,
            backoff_s=0.01,
        )
        [(rewrite, reason)] = rewriter.rewrite_many([("Find 1/2.", "\\frac{1}{2}")])
        assert reason == "ok" and rewrite.answer == 3
        assert rewriter.stats["requests"] == 6 and rewriter.stats["retries"] == 5
        # a second run is served from the cache
        again = LLMRewriter(server.base_url, "m", tmp_path / "cache.jsonl", backoff_s=0.01)
        assert again.rewrite_many([("Find 1/2.", "\\frac{1}{2}")])[0][1] == "ok"
        assert again.stats["cache_hits"] == 1 and len(server.requests) == 6


def test_gives_up_after_max_retries_and_caches_nothing(tmp_path: Path) -> None:
    with ScriptedServer(reply=REWRITE_REPLY, default="503") as server:
        rewriter = LLMRewriter(server.base_url, "m", tmp_path / "cache.jsonl", max_retries=2, backoff_s=0.01)
        [(rewrite, reason)] = rewriter.rewrite_many([("p", "1/2")])
        assert rewrite is None and reason.startswith("llm_request_failed: http_503 (")
        assert len(server.requests) == 3 and RequestCache(tmp_path / "cache.jsonl").entries == {}


def test_cache_survives_a_torn_last_line(tmp_path: Path) -> None:
    cache = RequestCache(tmp_path / "c.jsonl")
    cache.put("a", "reply")
    with open(tmp_path / "c.jsonl", "a") as handle:
        handle.write('{"key": "b", "cont')  # the crash happened here
    assert RequestCache(tmp_path / "c.jsonl").entries == {"a": "reply"}


_CHILD = """
import sys
from pathlib import Path
from data_pipeline.llm import LLMRewriter
r = LLMRewriter(sys.argv[1], "m", Path(sys.argv[2]), concurrency=2)
r.rewrite_many([(f"Problem {i}", "\\\\frac{1}{2}") for i in range(12)])
"""


def test_kill_and_resume_repeats_no_call(tmp_path: Path) -> None:
    cache = tmp_path / "cache.jsonl"
    with ScriptedServer(reply=REWRITE_REPLY, latency_s=0.25) as server:
        child = subprocess.Popen([sys.executable, "-c", _CHILD, server.base_url, str(cache)], cwd=ROOT)
        deadline = time.time() + 60
        while time.time() < deadline and (not cache.exists() or len(cache.read_text().splitlines()) < 4):
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
        child.wait()
        cached = len(RequestCache(cache).entries)
        assert 4 <= cached < 12, "the child was killed before finishing"
        served_before = len(server.requests)
        rewriter = LLMRewriter(server.base_url, "m", cache, concurrency=2)
        results = rewriter.rewrite_many([(f"Problem {i}", "\\frac{1}{2}") for i in range(12)])
        assert all(reason == "ok" for _, reason in results)
        assert rewriter.stats["cache_hits"] == cached
        # only the unanswered requests are sent again (the ones in flight at the kill were never answered)
        assert rewriter.stats["requests"] == 12 - cached
        assert served_before - cached <= 2  # at most `concurrency` answers were lost with the child


@pytest.mark.slow
def test_build_end_to_end_against_transformers_serve(tmp_path: Path, raw_data_dir: Path) -> None:
    """The real path: `transformers serve` with the embedded model, the CLI build with --rewriter llm, a rerun
    that sends no request. The 135M model rarely writes valid JSON: what matters is that every row ends
    verified or in rejected.jsonl with a reason."""
    from dapo_suite.inference.models import embedded_model_path

    model = str(embedded_model_path())
    port = free_port()
    serve = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "transformers"),
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--device",
            "cpu",
            "--dtype",
            "float32",
            model,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.time() + 180
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            pytest.fail("transformers serve did not come up in 180 s")
        source = tmp_path / "two.jsonl"
        source.write_text(
            "\n".join(
                json.dumps(r)
                for r in [
                    {
                        "problem": "What is $\\frac{1}{4}+\\frac{1}{4}$? Express your answer as a common "
                        "fraction.",
                        "answer": "\\frac{1}{2}",
                    },
                    {"problem": "Simplify $\\sqrt{8}$.", "answer": "2\\sqrt{2}"},
                    {"problem": "What is $2+3$?", "answer": "5"},
                ]
            )
        )
        command = [
            str(Path(sys.executable).parent / "dapo-suite"),
            "data",
            "build",
            "--input",
            str(source),
            "--out",
            str(tmp_path / "out"),
            "--rewriter",
            "llm",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--model",
            model,
            "--max-tokens",
            "48",
            "--concurrency",
            "2",
            "--decontaminate",
            "",
        ]
        first = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=ROOT)
        assert first.returncode == 0, first.stderr
        stats = json.loads((tmp_path / "out" / "stats.json").read_text())
        assert stats["llm"]["requests"] >= 2 and stats["llm"]["failed"] == 0
        rejected = [json.loads(x) for x in (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()]
        assert stats["exported_rows"] + len(rejected) == 3 and all(r["reason"] for r in rejected)
        # a change to a later stage only: the rewrite step reruns from the cache, no request is sent
        second = subprocess.run(
            command + ["--allow-unverified"], capture_output=True, text=True, timeout=120, cwd=ROOT
        )
        assert second.returncode == 0, second.stderr
        assert "[rewrite] resumed" in second.stdout
        (tmp_path / "out" / "stages" / "06_rewrite.meta.json").unlink()  # force the LLM step to run again
        third = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
        stats = json.loads((tmp_path / "out" / "stats.json").read_text())
        assert third.returncode == 0 and stats["llm"]["requests"] == 0 and stats["llm"]["cache_hits"] == 2
    finally:
        os.killpg(serve.pid, signal.SIGTERM)
        serve.wait(timeout=30)


@pytest.mark.slow
def test_the_rewriters_defaults_work_against_the_projects_own_endpoint(tmp_path: Path) -> None:
    """`data build --rewriter llm` with its default concurrency (8), timeout and max_tokens (1024) against
    `dapo-suite serve api` on the embedded model: with requests served one at a time, 8 of 15 failed by
    timeout; batched, every request is answered (the 135M model's rewrites are mostly rejected: what matters
    is that no request fails and every row is accounted for). One row already has an integer answer and needs
    no rewrite, so the build does not stop on "every row rejected for the same reason" when the model's
    rewrites all fail alike (they do or not with the CPU's sampling numerics)."""
    port = free_port()
    api = subprocess.Popen(
        [str(Path(sys.executable).parent / "dapo-suite"), "serve", "api", "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        for line in api.stdout:
            if "model:" in line:
                model = line.split("model:", 1)[1].strip()
                break
        else:
            pytest.fail("serve api did not start")
        source = tmp_path / "eight.jsonl"
        source.write_text(
            "\n".join(
                json.dumps(
                    {  # fractions: each row needs a rewrite to an integer answer
                        "problem": f"What is $\\frac{{1}}{{{a}}}+\\frac{{1}}{{{a}}}$? Express your answer as "
                        "a common fraction.",
                        "answer": f"\\frac{{2}}{{{a}}}",
                    }
                )
                for a in range(3, 18, 2)
            )
            + "\n"
            + json.dumps({"problem": "What is $2 + 3$?", "answer": "5"})
        )
        command = [
            str(Path(sys.executable).parent / "dapo-suite"),
            "data",
            "build",
            "--input",
            str(source),
            "--out",
            str(tmp_path / "out"),
            "--rewriter",
            "llm",
            "--base-url",
            f"http://127.0.0.1:{port}/v1",
            "--model",
            model,
            "--decontaminate",
            "",
        ]
        build = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
        assert build.returncode == 0, build.stderr[-3000:]
        stats = json.loads((tmp_path / "out" / "stats.json").read_text())
        assert stats["llm"]["requests"] >= 8 and stats["llm"]["failed"] == 0, stats["llm"]
        rejected = (tmp_path / "out" / "rejected.jsonl").read_text().splitlines()
        assert stats["exported_rows"] >= 1 and stats["exported_rows"] + len(rejected) == 9
    finally:
        os.killpg(api.pid, signal.SIGTERM)
        api.wait(timeout=30)
