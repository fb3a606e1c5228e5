"""`Sandbox.run(code)`: one call of model-written Python in a fresh isolated process, with a pool of warm
workers.

Every call gets a process of its own that no other call has touched. Starting one (bubblewrap, the
interpreter, numpy and sympy imported) takes about 0.4 s on a CPU core, far more than a typical call runs, so
a pool keeps `pool_size` workers started ahead: a call takes a ready one and a new one starts behind it. A
worker says when it is ready; the call's wall clock starts when its code is handed over. At a limit the whole
process tree is killed: the worker is the only process of its PID namespace's init (bubblewrap), which takes
every descendant with it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import selectors
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from dapo_suite.core.sandbox import seccomp
from dapo_suite.core.sandbox.isolation import SITE, bwrap_argv, interpreter_binds, require_isolation
from dapo_suite.core.sandbox.limits import RunResult, SandboxLimits

log = logging.getLogger(__name__)
WORKER_SOURCE = (Path(__file__).parent / "worker.py").read_text()
START_TIMEOUT = 60.0  # seconds a worker may take to get ready (imports on a busy machine)
MB = 1 << 20


class Worker:
    """One started, not yet used sandboxed process."""

    def __init__(self, isolation: str, limits: SandboxLimits, preload: bool) -> None:
        # unsafe-none: the packages from where this interpreter finds them (nothing is bound under SITE)
        site = SITE if isolation == "bwrap" else str(Path(__import__("numpy").__file__).parent.parent)
        config = {
            "site": site,
            "preload": preload,
            "cpu_seconds": limits.cpu_seconds,
            "memory_bytes": limits.memory_mb * MB,
            "file_size_bytes": limits.file_size_mb * MB,
        }
        program = [str(Path(sys.executable).resolve()), "-I", "-S", "-c", WORKER_SOURCE, json.dumps(config)]
        pass_fds, self._filter_fd = (), None
        if isolation == "bwrap":
            filter_bytes = seccomp.program()
            if filter_bytes is not None:
                read_end, write_end = os.pipe()
                os.write(write_end, filter_bytes)
                os.close(write_end)
                self._filter_fd, pass_fds = read_end, (read_end,)
            argv = bwrap_argv(interpreter_binds(), limits.tmp_mb * MB, self._filter_fd) + program
            env, cwd = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}, None
        else:
            argv, env, cwd = (
                program,
                {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "OPENBLAS_NUM_THREADS": "1"},
                "/tmp",
            )
        self.process = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            pass_fds=pass_fds,
            start_new_session=True,
        )
        if self._filter_fd is not None:
            os.close(self._filter_fd)

    def kill(self) -> None:
        """The whole process group, then reap: bubblewrap's PID namespace takes the rest with it."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def wait_ready(self, timeout: float) -> str | None:
        """None once the worker has said it is ready; else why it is not (its stderr)."""
        selector = selectors.DefaultSelector()
        selector.register(self.process.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout)
        selector.close()
        first = os.read(self.process.stdout.fileno(), 1) if ready else b""
        if first == b"R":
            return None
        self.kill()
        stderr = self.process.stderr.read().decode(errors="replace").strip()
        return stderr or (f"did not start within {timeout:.0f} s" if not ready else "exited at start")


class Sandbox:
    """Runs model-written Python. `isolation`: `bwrap` (checked at construction: `SandboxUnavailable` says
    what to install) or `unsafe-none`. `preload`: warm workers import numpy and sympy before their code
    arrives (about 0.4 s of CPU each, against 0.03 s for a bare worker: worth it only where most calls import
    them). Thread-safe: calls from several threads run side by side."""

    def __init__(
        self,
        limits: SandboxLimits | None = None,
        pool_size: int = 2,
        isolation: str = "bwrap",
        preload: bool = False,
    ) -> None:
        require_isolation(isolation)
        if isolation == "bwrap" and seccomp.program() is None:
            log.warning(
                "no seccomp filter for this machine (%s: x86_64 and aarch64 only): sandboxed code may start "
                "processes, bounded only by the call's limits and its PID namespace",
                platform.machine(),
            )
        if isolation == "unsafe-none":
            log.warning(
                "sandbox isolation is off (unsafe-none): model-written code runs as this user and can read "
                "its files, its environment and the network"
            )
        self.limits, self.isolation, self.preload = limits or SandboxLimits(), isolation, preload
        self.pool_size = max(pool_size, 0)
        self._spares: list[Worker] = []
        self._lock = threading.Lock()
        self._closed = False
        self._fill()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *_) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._closed, spares, self._spares = True, self._spares, []
        for worker in spares:
            worker.kill()

    def _fill(self) -> None:
        with self._lock:
            while not self._closed and len(self._spares) < self.pool_size:
                self._spares.append(Worker(self.isolation, self.limits, self.preload))

    def _take(self) -> Worker:
        with self._lock:
            worker = self._spares.pop(0) if self._spares else None
        if worker is None:
            worker = Worker(self.isolation, self.limits, self.preload)
        self._fill()
        return worker

    def run(self, code: str, stdin: str | None = None, wall_seconds: float | None = None) -> RunResult:
        """Run `code` in a fresh worker (`stdin`: what it reads as input; `wall_seconds`: a shorter wall-time
        limit for this call): its outcome, exit status, output (cut at the limit) and wall time."""
        worker = self._take()
        problem = worker.wait_ready(START_TIMEOUT)
        if problem is not None:
            return RunResult("sandbox_error", None, "", "", 0.0, f"the sandbox did not start: {problem}")
        start = time.monotonic()
        try:
            worker.process.stdin.write(json.dumps({"code": code, "stdin": stdin}).encode())
            worker.process.stdin.close()
        except BrokenPipeError:
            pass
        wall = min(wall_seconds, self.limits.wall_seconds) if wall_seconds else self.limits.wall_seconds
        result = self._collect(worker, start, wall)
        worker.kill()  # the worker has exited; this takes anything it left behind
        return result

    def _collect(self, worker: Worker, start: float, wall_seconds: float) -> RunResult:
        limits = self.limits
        deadline = start + wall_seconds
        buffers = {worker.process.stdout: bytearray(), worker.process.stderr: bytearray()}
        selector = selectors.DefaultSelector()
        for stream in buffers:
            selector.register(stream, selectors.EVENT_READ)
        outcome, message = None, ""
        while selector.get_map() and outcome is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                outcome, message = "timeout", f"Timed out: the wall-time limit of {wall_seconds:g} s"
                break
            for key, _ in selector.select(remaining):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    selector.unregister(key.fileobj)
                    continue
                buffer = buffers[key.fileobj]
                buffer += chunk
                if len(buffer) > limits.output_bytes:
                    del buffer[limits.output_bytes :]
                    outcome = "output_limit"
                    message = (
                        f"Output cut: the limit of {limits.output_bytes} bytes was reached and the "
                        "code stopped"
                    )
                    break
        selector.close()
        if outcome is None:
            try:
                worker.process.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                outcome, message = "timeout", f"Timed out: the wall-time limit of {wall_seconds:g} s"
        if outcome is not None:
            worker.kill()
        elapsed = time.monotonic() - start
        code = worker.process.returncode if outcome is None else None
        stdout, stderr = (
            bytes(buffers[s]).decode(errors="replace") for s in (worker.process.stdout, worker.process.stderr)
        )
        if outcome is None:
            outcome, message = self._outcome(code, stderr)
        return RunResult(outcome, code, stdout, stderr, round(elapsed, 4), message)

    def _outcome(self, code: int, stderr: str) -> tuple[str, str]:
        """How an exited call ended, from its exit status (bubblewrap passes on 128 + N for signal N) and
        stderr."""
        if code == 0:
            return "ok", ""
        number = code - 128 if code > 128 else -code if code < 0 else 0
        if number == signal.SIGXCPU:  # RLIMIT_CPU's soft limit (its hard one, a second later, is SIGKILL)
            return "cpu_limit", f"Stopped: the CPU time limit ({self.limits.cpu_seconds:g} s) was reached"
        if number:
            return "killed", f"Killed by signal {signal.Signals(number).name}"
        last_line = stderr.strip().rsplit("\n", 1)[-1]
        if last_line.startswith("MemoryError"):
            return "memory_limit", f"Stopped: the memory limit ({self.limits.memory_mb} MB) was reached"
        return "error", "" if stderr.strip() else f"Exited with status {code}"
