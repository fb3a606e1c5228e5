"""End to end on the CPU with the embedded model through the HF engine: the CLI, the run directory, resume
after a kill, re-scoring and comparing. Tiny settings (a few samples, a few tokens) keep it short."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from dapo_suite.cli import main
from eval.scoring import read_generations

RECORD_FIELDS = {
    "problem_id",
    "sample_index",
    "text",
    "finish_reason",
    "num_tokens",
    "answer",
    "score",
    "acc",
    "pred",
    "timeout",
    "too_complex",
}


def invoke(*args: str):
    result = CliRunner().invoke(main, ["eval", *args], catch_exceptions=False)
    return result


@pytest.fixture(scope="module")
def aime_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "aime24"
    result = invoke("aime24", "--n", "2", "--max-tokens", "8", "--limit", "2", "--out", str(out))
    assert result.exit_code == 0, result.output
    return out, result.output


def test_eval_writes_generations_results_and_report(aime_run):
    out, output = aime_run
    assert "avg@2 = " in output and "report:" in output
    records = read_generations(out / "generations.jsonl")
    assert sorted((r["problem_id"], r["sample_index"]) for r in records) == [
        ("2024-I-1", 0),
        ("2024-I-1", 1),
        ("2024-I-2", 0),
        ("2024-I-2", 1),
    ]
    for r in records:
        assert set(r) == RECORD_FIELDS
        assert r["finish_reason"] in ("stop", "length") and 1 <= r["num_tokens"] <= 8
        if r["finish_reason"] == "length":
            assert r["num_tokens"] == 8
    results = json.loads((out / "results.json").read_text())
    assert results["num_samples"] == 4 and results["complete"] and results["n"] == 2
    assert set(results["pass@k"]) == {"1", "2"} and results["tokens_per_s"] > 0
    assert results["config"]["top_p"] == 0.7 and results["config"]["template"] == "dapo"
    assert (out / "report.md").read_text().startswith("# Evaluation: aime24")
    assert (out / "report.png").stat().st_size > 10_000
    saved = json.loads((out / "config.json").read_text())
    assert saved["generation"]["n"] == 2 and saved["version"]


def test_rerun_generates_nothing_and_other_settings_are_refused(aime_run):
    out, _ = aime_run
    before = (out / "generations.jsonl").read_text()
    again = invoke("aime24", "--n", "2", "--max-tokens", "8", "--limit", "2", "--out", str(out))
    assert again.exit_code == 0 and "All 4 samples are on disk" in again.output
    assert (out / "generations.jsonl").read_text() == before
    other = invoke("aime24", "--n", "3", "--max-tokens", "8", "--limit", "2", "--out", str(out))
    assert other.exit_code != 0 and "n: saved 2, now 3" in other.output and "--out NEW_DIR" in other.output


def test_score_and_compare_without_a_model(aime_run, tmp_path):
    out, _ = aime_run
    scored = invoke("score", str(out / "generations.jsonl"), "--out", str(tmp_path / "rescored"))
    assert scored.exit_code == 0 and "re-graded 4 samples (0 verdicts changed" in scored.output
    original = json.loads((out / "results.json").read_text())
    rescored = json.loads((tmp_path / "rescored" / "results.json").read_text())
    assert rescored["avg@k"] == original["avg@k"] and rescored["pass@k"] == original["pass@k"]
    assert (tmp_path / "rescored" / "report.png").is_file()
    compared = invoke("compare", str(out), str(out))
    assert (
        compared.exit_code == 0
        and "(no problem differs)" in compared.output
        and "not significant" in compared.output
    )


def test_hf_engine_is_reproducible_and_reports_finish_reasons():
    from dapo_suite.inference.engines import HFEngine, Request, Sampling

    engine = HFEngine.load(batch_size=4)
    requests = [
        Request("a", 0, "Say hi.", 1),
        Request("a", 1, "Say hi.", 2),
        Request("b", 0, "What is 2+2?", 3),
    ]
    runs = []
    for _ in range(2):
        done = []
        engine.generate(requests, Sampling(1.0, 0.7, 6), done.append)
        runs.append(
            sorted((c.problem_id, c.sample_index, c.text, c.finish_reason, c.num_tokens) for c in done)
        )
    assert runs[0] == runs[1] and len(runs[0]) == 3
    assert all(reason == "stop" or tokens == 6 for *_, reason, tokens in runs[0])


@pytest.mark.slow
def test_kill_and_resume(tmp_path):
    """Kill the eval process once some samples are on disk; the rerun completes the set, repeating none."""
    out = tmp_path / "run"
    args = ["gsm8k", "--n", "2", "--limit", "3", "--max-tokens", "4", "--batch-size", "2", "--out", str(out)]
    code = "import sys; from dapo_suite.cli import main; sys.exit(main())"
    process = subprocess.Popen(
        [sys.executable, "-c", code, "eval", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    generations = out / "generations.jsonl"
    deadline = time.time() + 240
    try:
        while time.time() < deadline and process.poll() is None:
            if generations.is_file() and len(read_generations(generations)) >= 2:
                break
            time.sleep(0.2)
        assert process.poll() is None, "the eval finished before it could be killed"
        os.killpg(process.pid, signal.SIGKILL)
    finally:
        process.wait()
    first = read_generations(generations)
    assert 2 <= len(first) < 6
    resumed = invoke(*args)
    assert resumed.exit_code == 0, resumed.output
    assert f"{len(first)} samples on disk, {6 - len(first)} to generate" in resumed.output
    final = read_generations(generations)
    keys = [(r["problem_id"], r["sample_index"]) for r in final]
    assert len(keys) == len(set(keys)) == 6
    assert set(keys) == {(f"gsm8k-test-{p}", i) for p in range(3) for i in range(2)}
    assert final[: len(first)] == first  # finished samples are kept as they were
    assert json.loads((out / "results.json").read_text())["complete"]
