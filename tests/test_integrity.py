"""Nothing wrong gets in: one writer per output folder, damaged checkpoints refused, and failures of the
machine (disk full, file too large, read-only) reported as such. Each test runs the real command in a
subprocess."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from toy import run_train

from dapo_suite.testing.scripted_server import ScriptedServer


def faithful_rewrite(body: dict) -> str:
    """The scripted rewriter's answer: the problem without its format instruction, asking for m + n of 1/2."""
    problem = re.search(r"Problem: (.*)\nOriginal answer:", body["messages"][-1]["content"], re.DOTALL).group(
        1
    )
    rewritten = problem.replace(" Express your answer as a common fraction.", "") + (
        " The answer can be written as $\\frac{m}{n}$, where $m$ and $n$ are relatively prime positive "
        "integers. Find $m+n$."
    )
    return json.dumps(
        {"problem": rewritten, "answer": 3, "form": "m/n", "params": {"m": 1, "n": 2}, "target": "m+n"}
    )


def dapo_suite(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", *args], capture_output=True, text=True, timeout=600, **kwargs
    )


def raw_file(folder: Path, rows: int = 4) -> Path:
    path = folder / "raw.jsonl"
    path.write_text(
        "".join(
            json.dumps(
                {
                    "problem": f"A coin is flipped {i} times. What is the chance of heads? "
                    "Express your answer as a common fraction.",
                    "answer": "1/2",
                }
            )
            + "\n"
            for i in range(rows)
        )
    )
    return path


def test_a_second_data_build_into_the_same_folder_is_refused_at_once(tmp_path):
    out = tmp_path / "build"
    with ScriptedServer(reply=faithful_rewrite, latency_s=1.0) as server:
        first = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dapo_suite.cli",
                "data",
                "build",
                "--input",
                str(raw_file(tmp_path)),
                "--rewriter",
                "llm",
                "--base-url",
                server.base_url,
                "--model",
                "scripted",
                "--concurrency",
                "1",
                "--decontaminate",
                "",
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        lock = out / ".dapo-suite.lock"
        deadline = time.monotonic() + 120
        while not (lock.is_file() and lock.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        started = time.monotonic()
        second = dapo_suite(
            "data", "build", "--input", "arithmetic", "--decontaminate", "", "--out", str(out)
        )
        assert second.returncode == 1 and time.monotonic() - started < 60
        assert f"pid {first.pid}" in second.stderr and "another dapo-suite process" in second.stderr, (
            second.stderr
        )
        assert "Traceback" not in second.stderr
        assert first.wait(timeout=300) == 0, first.communicate()
    stats = json.loads((out / "stats.json").read_text())
    assert stats["config"]["inputs"] == [str(tmp_path / "raw.jsonl")]  # the first build's files, not a mix
    assert json.loads((out / "config.json").read_text())["inputs"] == [str(tmp_path / "raw.jsonl")]


def test_the_lock_of_a_killed_process_is_taken_over_and_said_so(tmp_path):
    out = tmp_path / "build"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\nfrom dapo_suite.core.lock import output_lock\n"
            "with output_lock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(600)",
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    result = dapo_suite("data", "build", "--input", "arithmetic", "--decontaminate", "", "--out", str(out))
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"taking over the lock of pid {holder.pid}" in result.stdout + result.stderr
    assert (out / "train.parquet").is_file()


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """Two steps of the tiny run: checkpoints step-000001 and step-000002 (keep_checkpoints 2)."""
    out = tmp_path_factory.mktemp("integrity") / "run"
    result = run_train(out, "--max-steps", "2")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    return out


def link_weights(source: str, target: str) -> None:
    """Weights and optimizer state (GBs a run) hard-linked, other files copied: a run writes new checkpoint
    files and never rewrites these in place, so the copy cannot change the module's run."""
    if source.endswith((".safetensors", ".pt")):
        os.link(source, target)
    else:
        shutil.copy2(source, target)


def damaged_copy(run: Path, tmp_path: Path, damage) -> tuple[Path, subprocess.CompletedProcess]:
    copy = tmp_path / "run"
    shutil.copytree(run, copy, symlinks=True, copy_function=link_weights)
    damaged = copy / "checkpoints" / "step-000002"
    shutil.rmtree(damaged)
    shutil.copytree(
        run / "checkpoints" / "step-000002", damaged
    )  # files of its own: damage stays in the copy
    damage(damaged)
    return copy, run_train(copy, "--max-steps", "3", "--resume")


def flip_one_bit(checkpoint: Path) -> None:
    path = checkpoint / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40  # inside the tensors, past the header
    path.write_bytes(bytes(data))


def test_a_bit_flipped_checkpoint_is_refused_and_names_the_file(trained_run, tmp_path):
    copy, result = damaged_copy(trained_run, tmp_path, flip_one_bit)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert "model.safetensors" in result.stderr and "SHA-256" in result.stderr
    assert "step-000001" in result.stderr  # the previous checkpoint, kept, is named
    steps = [json.loads(line).get("step") for line in (copy / "metrics.jsonl").read_text().splitlines()]
    assert 3 not in steps  # nothing trained on the damaged weights


def test_a_truncated_trainer_state_is_refused_and_names_the_file(trained_run, tmp_path):
    def truncate(checkpoint: Path) -> None:
        path = checkpoint / "trainer_state.pt"
        path.write_bytes(path.read_bytes()[:1000])
        (
            checkpoint / "checksums.json"
        ).unlink()  # as a checkpoint from before checksums: torch.load must fail

    _, result = damaged_copy(trained_run, tmp_path, truncate)
    assert (
        result.returncode == 1
        and "Traceback" not in result.stderr
        and "bug in dapo-suite" not in result.stderr
    )
    assert "trainer_state.pt cannot be read" in result.stderr


def test_non_finite_weights_are_refused_even_with_matching_checksums(trained_run, tmp_path):
    def poison(checkpoint: Path) -> None:
        import torch
        from safetensors.torch import load_file, save_file

        weights = load_file(checkpoint / "model.safetensors")
        name = sorted(weights)[3]
        weights[name].view(-1)[:5] = float("nan")
        save_file(weights, checkpoint / "model.safetensors", metadata={"format": "pt"})
        from dapo_suite.train.checkpoint import _write_checksums

        (checkpoint / "checksums.json").unlink()
        _write_checksums(checkpoint)
        assert torch.isnan(load_file(checkpoint / "model.safetensors")[name]).any()

    _, result = damaged_copy(trained_run, tmp_path, poison)
    assert result.returncode == 1 and "NaN or Inf" in result.stderr and "model.safetensors" in result.stderr


def _limit_file_size() -> None:
    signal.signal(
        signal.SIGXFSZ, signal.SIG_IGN
    )  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))


def test_a_file_too_large_is_reported_as_the_machines_limit_not_a_bug(tmp_path):
    out = tmp_path / "build"
    result = dapo_suite(
        "data",
        "build",
        "--input",
        "arithmetic",
        "--decontaminate",
        "",
        "--out",
        str(out),
        preexec_fn=_limit_file_size,
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "File too large" in result.stderr and str(out) in result.stderr
    assert "bug in dapo-suite" not in result.stderr and "Traceback" not in result.stderr
