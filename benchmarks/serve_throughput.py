"""`dapo-suite serve api` under concurrent clients: dapo-suite's batched sampler (`--engine sampler`, the CPU
default) against `transformers serve` (`--engine transformers`, what the endpoint ran before) behind the same
OpenAI front, on the same model. Target (2 CPU cores): at 16 concurrent streams, >= 8x the aggregate tokens/s of
`transformers serve`, and time to first token p95 under 10 s.

    .venv/bin/python benchmarks/serve_throughput.py                       # 1, 16 and 64 clients, embedded model
    .venv/bin/python benchmarks/serve_throughput.py --clients 1,16 --max-tokens 64 --model runs/dapo/checkpoint-last

Each client sends one streamed chat request at the same moment (a different arithmetic question in the DAPO
prompt each, T 1.0, top_p 0.7 as the paper evaluates, seed = client index) and reads its stream; the figures are
time to first token (p50, p95 over the clients), the slowest client's total time, and the aggregate rate:
completion tokens of all clients (the server's usage counts) over the wall time from the first request to the last
reply. Both servers run from the start, each idle while the other is measured; the engines alternate at each
client count. Prints the CPU's vector flags and the load average beside the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dapo_suite.core.prompts import format_prompt  # noqa: E402
from dapo_suite.inference.endpoint import Endpoint, free_port, stop_process, wait_healthy  # noqa: E402

ENGINES = ("transformers", "sampler")


def cpu_line() -> str:
    """The CPU's model, its vector extensions that matter to the kernels, cores, and the load average now."""
    info = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = set(re.search(r"flags\s*:\s*(.*)", info)[1].split()) if "flags" in info else set()
    vector = [flag for flag in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16") if flag in flags]
    load = os.getloadavg()
    return (f"CPU: {model[1] if model else 'unknown'}, {os.cpu_count()} cores, flags {' '.join(vector) or 'none'}; "
            f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


@contextlib.contextmanager
def served(engine: str, model: str | None) -> Iterator[str]:
    """`dapo-suite serve api --engine ENGINE` as users start it; yields its base URL."""
    port = free_port()
    command = [str(Path(sys.executable).parent / "dapo-suite"), "serve", "api", "--engine", engine, "--port", str(port)]
    if model:
        command += ["--model", model]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    endpoint = Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model_name="", process=process, engine=engine)
    try:
        wait_healthy(endpoint, 600)
        yield endpoint.base_url
    finally:
        stop_process(process)


async def one_client(client: httpx.AsyncClient, url: str, index: int, max_tokens: int) -> tuple[float, int]:
    """(time to the first content token, completion tokens) of one streamed chat request."""
    question = f"What is {index % 9 + 2} times {index // 9 % 4 + 2}?"
    body = {"messages": [{"role": "user", "content": format_prompt(question)}], "max_tokens": max_tokens,
            "temperature": 1.0, "top_p": 0.7, "seed": index, "stream": True,
            "stream_options": {"include_usage": True}}
    start, first, tokens = time.perf_counter(), None, 0
    async with client.stream("POST", url + "/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                first = time.perf_counter() - start
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return (first if first is not None else time.perf_counter() - start), tokens


async def measure(url: str, clients: int, max_tokens: int) -> dict:
    async with httpx.AsyncClient(timeout=None, limits=httpx.Limits(max_connections=clients + 4)) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(one_client(client, url, index, max_tokens) for index in range(clients)))
        wall = time.perf_counter() - start
    firsts = sorted(first for first, _ in results)
    tokens = sum(count for _, count in results)
    return {"clients": clients, "ttft_p50_s": statistics.median(firsts),
            "ttft_p95_s": firsts[min(len(firsts) - 1, round(0.95 * (len(firsts) - 1)))], "wall_s": wall,
            "tokens": tokens, "tokens_per_s": tokens / wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="checkpoint dir or hub id (default: the embedded model)")
    parser.add_argument("--clients", default="1,16,64", help="comma-separated concurrent client counts")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    counts = [int(count) for count in args.clients.split(",")]
    print(cpu_line())
    rows = []
    with served("transformers", args.model) as transformers_url, served("sampler", args.model) as sampler_url:
        urls = {"transformers": transformers_url, "sampler": sampler_url}
        for turn, clients in enumerate(counts):
            asyncio.run(measure(urls["sampler"], 1, 8))  # warm-up: the first request pays one-time costs
            asyncio.run(measure(urls["transformers"], 1, 8))
            for engine in ENGINES if turn % 2 == 0 else ENGINES[::-1]:
                row = {"engine": engine, **asyncio.run(measure(urls[engine], clients, args.max_tokens))}
                rows.append(row)
                print(f"{engine:<13} {clients:>3} clients: first token p50 {row['ttft_p50_s']:6.2f} s, p95 "
                      f"{row['ttft_p95_s']:6.2f} s; {row['tokens']:>5} tokens in {row['wall_s']:6.1f} s = "
                      f"{row['tokens_per_s']:6.1f} tokens/s", flush=True)
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
        args.json.write_text(json.dumps({"cpu": cpu_line(), "max_tokens": args.max_tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
