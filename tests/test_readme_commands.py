"""The README's "Using it" commands, read from README.md and run in order in a fresh folder, each checked to
do what its line says (issue 62), on the embedded model at toy scale: the flags appended to a line only make
it cheaper (a step or two, two AIME problems, 8 tokens; a free port), and a placeholder (runs/eval/A, B)
becomes the evaluations run before it. The named raw set math_train is a stand-in in MATH's format (the
shipped arithmetic problems) under a data root of the test's own, so the data build runs as the README writes
it without the 7,500-problem download."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
from toy import TOY_FLAGS

from dapo_suite.core.ports import free_port

REPO = Path(__file__).resolve().parent.parent
ARITHMETIC = REPO / "data_pipeline" / "raw" / "arithmetic.jsonl"
CHEAP_EVAL = ["--limit", "2", "--n", "1", "--max-tokens", "8"]


def readme_commands() -> list[list[str]]:
    """The argv of each `dapo-suite ...` line of the README's "Using it" block, comments dropped."""
    section = (REPO / "README.md").read_text().split("## Using it", 1)[1].split("\n## ", 1)[0]
    lines = [line.strip() for line in section.splitlines() if line.startswith("    dapo-suite ")]
    return [shlex.split(line, comments=True)[1:] for line in lines]


def _run(args: list[str], cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert result.returncode == 0, (
        f"dapo-suite {shlex.join(args)}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    )
    return result


def _served(args: list[str], cwd: Path, env: dict, ready: str):
    """A serving command started in the background; (process, its output up to the line holding `ready`)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "dapo_suite.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines = []
    for line in process.stdout:
        lines.append(line)
        if ready in line or len(lines) > 300:
            break
    return process, "".join(lines)


def _stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


@pytest.mark.slow
def test_the_readme_commands_run_in_order_on_a_fresh_folder(tmp_path):
    commands = readme_commands()
    assert [" ".join(args[:2]) for args in commands] == [
        "data build",
        "train --preset",
        "train --resume",
        "train ladder",
        "eval aime24",
        "eval compare",
        "report runs/dapo",
        "serve --model",
        "serve api",
    ], commands
    root = tmp_path / "data-root" / "math_train"
    root.mkdir(parents=True)
    rows = [json.loads(line) for line in ARITHMETIC.read_text().splitlines()]
    root.joinpath("train.jsonl").write_text(
        "".join(
            json.dumps(
                {
                    "problem": row["question"],
                    "solution": f"So the answer is $\\boxed{{{row['answer']}}}$.",
                    "answer": row["answer"],
                    "level": "Level 1",
                    "type": "Prealgebra",
                }
            )
            + "\n"
            for row in rows
        )
    )
    env = {**os.environ, "DAPO_SUITE_DATA": str(root.parent), "HF_HUB_OFFLINE": "1"}
    work = tmp_path / "clone"
    work.mkdir()
    data, train, resume, ladder, evaluate, compare, report, chat, api = commands

    _run(data, work, env)  # integer-answer RL data
    assert (work / "data" / "math" / "train.parquet").is_file()

    _run([*train, "--set", "max_steps=1", *TOY_FLAGS], work, env)
    config = (work / "runs" / "dapo" / "config.yaml").read_text()
    assert "train_file: data/math/train.parquet" in config and "group_size: 2" in config
    assert (work / "runs" / "dapo" / "checkpoint-last" / "model.safetensors").is_file()

    # continue after a crash: the same run, its own data and settings, one step further
    _run([*resume, "--set", "max_steps=2"], work, env)
    steps = [
        json.loads(line)["step"]
        for line in (work / "runs" / "dapo" / "metrics.jsonl").read_text().splitlines()
        if "reward/acc" in line
    ]
    assert steps == [1, 2]
    assert "train_file: data/math/train.parquet" in (work / "runs" / "dapo" / "config.yaml").read_text()

    _run([*ladder, "--seeds", "1", "--max-steps", "1", "--presets", "dapo", *TOY_FLAGS], work, env)
    assert (work / "runs" / "ladder" / "ladder.md").is_file()

    _run([*evaluate, *CHEAP_EVAL], work, env)
    _run(["eval", "aime24", *CHEAP_EVAL], work, env)  # the starting model: the other side of the comparison
    runs = {path.name: path for path in (work / "runs" / "eval").iterdir()}
    assert set(runs) == {"aime24-checkpoint-last", "aime24-embedded"}, runs
    placeholders = {
        "runs/eval/A": "runs/eval/aime24-embedded",
        "runs/eval/B": "runs/eval/aime24-checkpoint-last",
    }
    compared = _run([placeholders.get(arg, arg) for arg in compare], work, env)
    assert "paired bootstrap over problems" in compared.stdout

    _run(report, work, env)  # one page per run
    assert (work / "runs" / "dapo" / "report.md").read_text().startswith("# dapo-suite report: dapo\n")
    assert (work / "runs" / "dapo" / "report.html").is_file()

    port = free_port()
    process, output = _served([*chat, "--port", str(port)], work, env, "Model server:")
    try:
        assert "model checkpoint-last" in output, output
        deadline = time.monotonic() + 120
        while True:  # Gradio starts after the model server has answered its health check
            try:
                page = httpx.get(f"http://127.0.0.1:{port}/config", timeout=10)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and process.poll() is None, output
                time.sleep(1)
        assert page.status_code == 200 and "DAPO reasoner chat" in page.text
    finally:
        _stop(process)

    process, output = _served([*api, "--port", str(free_port())], work, env, "model:")
    try:
        base_url = re.search(r"base URL: (\S+)", output)[1]
        assert re.search(r"model: +checkpoint-last$", output, re.MULTILINE), output
        client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="checkpoint-last", max_tokens=4, messages=[{"role": "user", "content": "What is 2 + 2?"}]
        )
        assert reply.choices[0].message.content is not None and reply.usage.completion_tokens > 0
    finally:
        _stop(process)
