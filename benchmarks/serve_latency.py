"""What the chat app costs on top of its endpoint: time to first token and tokens/s through the app (gradio_client
streaming from `dapo-suite serve --endpoint`, run as its own process as users run it) against the same endpoint
called directly (openai streaming). Target: the app adds under 10 % to either.

    .venv/bin/python benchmarks/serve_latency.py                     # starts transformers serve, embedded model
    .venv/bin/python benchmarks/serve_latency.py --endpoint http://127.0.0.1:8000/v1 --model NAME --rounds 5

Both paths decode greedily (temperature 0) with the same prompt and budget, so they generate the same tokens;
rounds alternate between the paths so that load from other processes falls on both alike.
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dapo_suite.prompts import format_prompt  # noqa: E402
from serve.endpoint import connect_endpoint, free_port, start_endpoint, stop_process  # noqa: E402

QUESTION = "What is 7 + 5?"


def direct(endpoint, max_tokens: int) -> tuple[float, float, int]:
    """(time to first token, tokens/s after it, tokens) over openai streaming."""
    import openai

    client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused", max_retries=0)
    start = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model=endpoint.model_name, messages=[{"role": "user", "content": format_prompt(QUESTION)}], stream=True,
        temperature=0.0, top_p=1.0, max_tokens=max_tokens)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
            first = first or time.perf_counter() - start
    end = time.perf_counter() - start
    return first, (tokens - 1) / (end - first), tokens


def through_app(client, max_tokens: int) -> tuple[float, float, int]:
    """The same request through the app's /chat API; the token count comes from the app's own figures."""
    start = time.perf_counter()
    first = None
    job = client.submit(QUESTION, 0.0, 1.0, max_tokens, True, api_name="/chat")
    for update in job:
        if first is None and update and update[0]["content"] not in ("", "…"):
            first = time.perf_counter() - start
    end = time.perf_counter() - start
    final = job.result()  # raises the app's error, if any
    tokens = int(re.search(r"(\d+) tokens", final[-1]["content"])[1])
    return first, (tokens - 1) / (end - first), tokens


@contextlib.contextmanager
def app_process(endpoint, port: int):
    """`dapo-suite serve --endpoint URL` in its own process, as users run it."""
    command = [sys.executable, "-c", "from dapo_suite.cli import main; main()", "serve", "--endpoint",
               endpoint.base_url, "--model", endpoint.model_name, "--port", str(port)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/gradio_api/info", timeout=2).status_code == 200:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the chat app did not start")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/"
    finally:
        stop_process(process)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--endpoint", help="a running OpenAI-compatible server (default: start the embedded model)")
    parser.add_argument("--model", help="model to serve, or with --endpoint the served model name")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    from gradio_client import Client

    served = (contextlib.nullcontext(connect_endpoint(args.endpoint, args.model)) if args.endpoint
              else start_endpoint(args.model, startup_timeout_s=600))
    with served as endpoint, app_process(endpoint, free_port()) as url:
        client = Client(url, verbose=False)
        direct(endpoint, 16), through_app(client, 16)  # warm-up: first-request costs of both paths
        results = {"direct": [], "app": []}
        for _ in range(args.rounds):
            results["direct"].append(direct(endpoint, args.max_tokens))
            results["app"].append(through_app(client, args.max_tokens))
    median = {path: [statistics.median(column) for column in zip(*rows, strict=True)] for path, rows in results.items()}
    print(f"endpoint {endpoint.base_url}, {args.rounds} rounds, {args.max_tokens} max tokens, greedy")
    print(f"{'path':<8} {'first token (s)':>16} {'tokens/s':>10} {'tokens':>7}")
    for path, (ttft, speed, tokens) in median.items():
        print(f"{path:<8} {ttft:>16.3f} {speed:>10.2f} {tokens:>7.0f}")
    ttft_ratio = median["app"][0] / median["direct"][0]
    speed_ratio = median["direct"][1] / median["app"][1]
    print(f"app / direct time to first token: {ttft_ratio:.3f} ({(ttft_ratio - 1) * 100:+.1f} %)")
    print(f"direct / app tokens/s:            {speed_ratio:.3f} ({(speed_ratio - 1) * 100:+.1f} %)")
    verdict = "within" if max(ttft_ratio, speed_ratio) < 1.10 else "OVER"
    print(f"target: the app adds under 10 % to either -> {verdict}")


if __name__ == "__main__":
    main()
