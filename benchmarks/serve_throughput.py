"""`dapo-suite serve api` under concurrent clients: dapo-suite's batched sampler (`--engine sampler`, the CPU
default) against `transformers serve` (`--engine transformers`, what the endpoint ran before) behind the same
OpenAI front, on the same model. Target (2 CPU cores): at 16 concurrent streams, >= 8x the aggregate tokens/s of
`transformers serve`, and time to first token p95 under 10 s.

    .venv/bin/python benchmarks/serve_throughput.py                       # 1, 16 and 64 clients, 256 tokens
    .venv/bin/python benchmarks/serve_throughput.py --clients 1,16 --max-tokens 64 --model runs/dapo/checkpoint-last

Each measurement runs `--duration` seconds with a fixed number of clients, each sending streamed chat requests
back to back (a two-step word problem in the DAPO prompt, numbers varying by request; T 1.0, top_p 0.7 as the
paper evaluates; a seed per request), as serving benchmarks hold a concurrency level. Figures: tokens received
per second of the window (completion tokens from the server's usage for finished requests, streamed pieces for
those cut by the end of the window), and time to first token, p50 and p95 over the requests sent (one still
waiting at the end counts as waiting until then: a lower bound, and the count is printed). Both servers run from
the start, each idle while the other is measured; the engines alternate at each client count. Prints the CPU's
vector flags and the load average beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dapo_suite.core.ports import free_port  # noqa: E402
from dapo_suite.core.prompts import format_prompt  # noqa: E402
from dapo_suite.core.provenance import cpu_description  # noqa: E402
from dapo_suite.inference.endpoint import Endpoint, stop_process, wait_healthy  # noqa: E402

ENGINES = ("transformers", "sampler")


def cpu_line() -> str:
    """The CPU's model, its vector extensions that matter to the kernels, cores, and the load average now."""
    load = os.getloadavg()
    return f"CPU: {cpu_description()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


@contextlib.contextmanager
def served(engine: str, model: str | None, dtype: str = "auto") -> Iterator[str]:
    """`dapo-suite serve api --engine ENGINE --dtype DTYPE` as users start it; yields its base URL."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "dapo-suite"), "serve", "api", "--engine", engine, "--port", str(port),
               "--dtype", dtype]
    if model:
        command += ["--model", model]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model_name="", process=process, engine=engine)
    try:
        wait_healthy(endpoint, 600)
        yield endpoint.base_url
    finally:
        stop_process(process)


async def client_loop(client: httpx.AsyncClient, url: str, index: int, max_tokens: int, deadline: float,
                      requests: list[dict]) -> None:
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
                "temperature": 1.0, "top_p": 0.7, "seed": seed, "stream": True,
                "stream_options": {"include_usage": True}}
        record = {"sent": time.perf_counter(), "first": None, "tokens": 0, "done": False}
        requests.append(record)
        async with client.stream("POST", url + "/chat/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                    record["first"] = record["first"] or time.perf_counter()
                    record["tokens"] += 1  # a piece is a token (or a few, for a character split over tokens)
                if chunk.get("usage"):
                    record["tokens"], record["done"] = chunk["usage"]["completion_tokens"], True


async def measure(url: str, clients: int, max_tokens: int, duration_s: float) -> dict:
    """`clients` clients running back to back for `duration_s`: tokens received per second of the window, and
    time to first token over the requests sent in it (a request still without one at the end counts as waiting
    until the end: its figure is a lower bound)."""
    requests: list[dict] = []
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=clients + 4)) as client:
        start = time.perf_counter()
        deadline = start + duration_s
        tasks = [asyncio.create_task(client_loop(client, url, index, max_tokens, deadline, requests))
                 for index in range(clients)]
        await asyncio.wait(tasks, timeout=duration_s)
        end = time.perf_counter()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    firsts = sorted((record["first"] or end) - record["sent"] for record in requests)
    waiting = sum(record["first"] is None for record in requests)
    tokens = sum(record["tokens"] for record in requests)
    return {"clients": clients, "requests": len(requests), "completed": sum(r["done"] for r in requests),
            "no_first_token": waiting, "ttft_p50_s": statistics.median(firsts),
            "ttft_p95_s": firsts[min(len(firsts) - 1, round(0.95 * (len(firsts) - 1)))], "window_s": end - start,
            "tokens": tokens, "tokens_per_s": tokens / (end - start)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint dir or hub id (default: the embedded model)")
    parser.add_argument("--clients", default="1,16,64", help="comma-separated concurrent client counts")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds each measurement runs")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="both servers' precision (auto: as users start them; the sampler takes bf16 where the CPU "
                             "has it natively, transformers serve the weights' dtype)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    counts = [int(count) for count in args.clients.split(",")]
    print(cpu_line(), f"--dtype {args.dtype}")
    rows = []
    with (served("transformers", args.model, args.dtype) as transformers_url,
          served("sampler", args.model, args.dtype) as sampler_url):
        urls = {"transformers": transformers_url, "sampler": sampler_url}
        for turn, clients in enumerate(counts):
            for engine in ENGINES if turn % 2 == 0 else ENGINES[::-1]:
                httpx.post(urls[engine] + "/chat/completions", timeout=300, json={  # warm-up: one short request
                    "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8}).raise_for_status()
                row = {"engine": engine, **asyncio.run(measure(urls[engine], clients, args.max_tokens, args.duration))}
                rows.append(row)
                print(f"{engine:<13} {clients:>3} clients: first token p50 {row['ttft_p50_s']:6.2f} s, p95 "
                      f"{row['ttft_p95_s']:6.2f} s; {row['tokens']:>5} tokens in {row['window_s']:5.1f} s = "
                      f"{row['tokens_per_s']:6.1f} tokens/s; {row['completed']}/{row['requests']} requests "
                      f"completed, {row['no_first_token']} without a first token", flush=True)
    print(f"\n{'clients':>7} {'sampler tok/s':>14} {'transformers tok/s':>19} {'ratio':>6} "
          f"{'sampler TTFT p95':>17} {'transformers TTFT p95':>22}")
    for clients in counts:
        ours, theirs = (next(r for r in rows if r["engine"] == e and r["clients"] == clients)
                        for e in ("sampler", "transformers"))
        print(f"{clients:>7} {ours['tokens_per_s']:>14.1f} {theirs['tokens_per_s']:>19.1f} "
              f"{ours['tokens_per_s'] / theirs['tokens_per_s']:>5.1f}x {ours['ttft_p95_s']:>15.2f} s "
              f"{theirs['ttft_p95_s']:>20.2f} s")
    print(cpu_line())
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_line(), "dtype": args.dtype, "max_tokens": args.max_tokens,
                                         "duration_s": args.duration, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
