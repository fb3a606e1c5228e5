"""The toy training scale and the CLI runners shared by the end-to-end tests: `dapo-suite ARGS...` to
completion, and `dapo-suite serve api` as a running child (a module, not a conftest: the tests import what
they use)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from dapo_suite.core.ports import free_port

# Toy training scale: seconds per step on a CPU.
TOY = {
    "group_size": 2,
    "gen_batch_size": 2,
    "train_batch_size": 2,
    "mini_batch_size": 1,
    "micro_batch_size": 4,
    "max_response_length": 8,
    "overlong_buffer_len": 4,
    "heldout_size": 4,
    "val_n": 1,
    "max_num_gen_batches": 1,
}
TOY_FLAGS = [arg for key, value in TOY.items() for arg in ("--set", f"{key}={value}")]


# A run small enough for a test: 2 prompts x 2 responses of at most 8 tokens per step, 1 held-out problem.
TINY = [
    "--preset",
    "+token-loss",
    "--set",
    "overlong_filter=false",
    "--set",
    "heldout_size=2",
    "--set",
    "val_n=1",
    "--set",
    "group_size=2",
    "--set",
    "gen_batch_size=2",
    "--set",
    "train_batch_size=2",
    "--set",
    "mini_batch_size=1",
    "--set",
    "micro_batch_size=4",
    "--set",
    "max_response_length=8",
    "--set",
    "overlong_buffer_len=4",
    "--set",
    "val_max_response_length=8",
]


def run_train(out: Path, *extra: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`dapo-suite train` at the TINY scale into `out`, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", "train", "--out", str(out), *TINY, *extra],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def dapo_suite(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`dapo-suite ARGS...` in a fresh interpreter, output captured."""
    return subprocess.run(
        [sys.executable, "-m", "dapo_suite.cli", *args], capture_output=True, text=True, timeout=timeout
    )


@dataclass(frozen=True)
class ServedApi:
    """A running `dapo-suite serve api`: the base URL and model name it printed, its port and its process."""

    base_url: str
    model: str
    port: int
    process: subprocess.Popen


@contextmanager
def serve_api(
    *args: str, env: dict[str, str] | None = None, max_lines: int = 200, stop_timeout_s: float = 30
) -> Iterator[ServedApi]:
    """`dapo-suite serve api --port PORT ARGS...` on a free port in a fresh interpreter, given once it has
    printed its base URL and model (read from at most `max_lines` lines of its output); on exit SIGTERM, then
    a kill if it has not stopped within `stop_timeout_s`. `env`: the child's whole environment (default: this
    process's)."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "dapo_suite.cli", "serve", "api", "--port", str(port), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines: list[str] = []
        for line in process.stdout:
            lines.append(line)
            if "model:" in line or len(lines) > max_lines:
                break
        text = "".join(lines)
        base_url, model = re.search(r"base URL: (\S+)", text), re.search(r"model: +(\S+)", text)
        assert base_url and model, text[-3000:]
        yield ServedApi(base_url[1], model[1], port, process)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(stop_timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
