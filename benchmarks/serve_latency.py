"""What the chat app costs on top of its endpoint: time to first token and tokens/s through the app
(`dapo-suite serve --endpoint`, run as its own process as users run it) against the same endpoint called
directly (openai streaming). Target: the app adds under 10 % to either.

Three clients reach the app:
  api             the app's /chat API over Gradio's event protocol with plain httpx (POST
  /gradio_api/queue/join,
                  then the server-sent events of /gradio_api/queue/data, applying Gradio's diffs): the app's
                  own cost, and what the target is judged on;
  browser         a real browser (Debian's chromium, headless, via Playwright): Enter pressed -> first reply
  text
                  on the page -> the reply's figures line; adds what the page does around the model call
                  (three small requests before it, as Gradio's ChatInterface chains its events) and the
                  browser's rendering, on the same cores as the model;
  gradio_client   the Python client the tests use, which adds latency of its own (a thread per job, a second
                  connection opened after the join).

    .venv/bin/python -m benchmarks.serve_latency                     # starts transformers serve, embedded
    model .venv/bin/python -m benchmarks.serve_latency --endpoint http://127.0.0.1:8000/v1 --model NAME
    --rounds 5 .venv/bin/python -m benchmarks.serve_latency --pin-model-cpu     # model server alone on one
    core

All paths decode greedily (temperature 0) with the same prompt and budget, so they generate the same tokens;
each request through the app starts a new conversation (one user turn, as the direct request sends); rounds
alternate between the paths so that load from other processes falls on all alike; figures are medians over the
rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

from dapo_suite.core.ports import free_port
from dapo_suite.core.prompts import format_prompt
from dapo_suite.core.provenance import cpu_line
from dapo_suite.inference.endpoint import connect_endpoint, start_endpoint, stop_process

QUESTION = "What is 7 + 5?"


def figures(first: float, end: float, tokens: int) -> tuple[float, float, int]:
    """(time to first token, tokens/s after it, tokens) from the times of the first token and of the end."""
    return first, (tokens - 1) / (end - first), tokens


def direct(client, endpoint, max_tokens: int) -> tuple[float, float, int]:
    """The figures over openai streaming."""
    start = time.perf_counter()
    first, tokens = None, 0
    stream = client.chat.completions.create(
        model=endpoint.model_name,
        messages=[{"role": "user", "content": format_prompt(QUESTION)}],
        stream=True,
        temperature=0.0,
        top_p=1.0,
        max_tokens=max_tokens,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            tokens += 1
            first = first or time.perf_counter() - start
    return figures(first, time.perf_counter() - start, tokens)


def _reply_tokens(figures_line: str) -> int:
    """The app's own token count, from the figures line of its final message."""
    return int(re.search(r"(\d+) tokens", figures_line)[1])


def _shows_text(messages: list[dict] | None) -> bool:
    """Whether an update shows reply text (the app shows "…" until the first token arrives)."""
    return bool(messages) and messages[0]["content"] not in ("", "…")


def through_api(http: httpx.Client, fn_index: int, max_tokens: int) -> tuple[float, float, int]:
    """The request over Gradio's event protocol: join the queue, read the event stream, apply each update's
    diff."""
    from gradio_client.utils import apply_diff

    session = uuid.uuid4().hex
    payload = {
        "data": [QUESTION, [], 0.0, 1.0, max_tokens, True],
        "fn_index": fn_index,
        "session_hash": session,
        "event_data": None,
        "trigger_id": None,
    }
    start = time.perf_counter()
    http.post("gradio_api/queue/join", json=payload).raise_for_status()
    first, messages = None, None
    with http.stream("GET", "gradio_api/queue/data", params={"session_hash": session}) as events:
        for line in events.iter_lines():
            if not line.startswith("data:"):
                continue
            event = json.loads(line[len("data:") :])
            if event["msg"] == "process_generating":
                update = event["output"]["data"][0]
                messages = update if messages is None else apply_diff(messages, update)
                if first is None and _shows_text(messages):
                    first = time.perf_counter() - start
            elif event["msg"] == "process_completed":
                if not event.get("success", True):
                    raise RuntimeError(f"the app failed: {event['output']}")
                messages = event["output"]["data"][0]
                break
    end = time.perf_counter() - start
    return figures(first, end, _reply_tokens(messages[-1]["content"]))


def through_gradio_client(client, max_tokens: int) -> tuple[float, float, int]:
    """The same request through gradio_client's streaming job."""
    # The /chat API keeps the conversation in session state: a new session per round sends one user turn, as
    # the direct path does, instead of a conversation that grows by a turn each round (a longer prompt each
    # time).
    client.reset_session()
    start = time.perf_counter()
    first = None
    job = client.submit(QUESTION, 0.0, 1.0, max_tokens, True, api_name="/chat")
    for update in job:
        if first is None and _shows_text(update):
            first = time.perf_counter() - start
    end = time.perf_counter() - start
    return figures(first, end, _reply_tokens(job.result()[-1]["content"]))  # result() raises the app's error


# Page clock (performance.now(), ms) of Enter, of the first reply text shown and of the figures line; the
# Thinking message shows "…" until the first token arrives.
_WATCH_REPLY = """() => {
  const marks = window.replyMarks = {enter: null, first: null, end: null, stats: null};
  document.querySelector('#question textarea').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && marks.enter === null) marks.enter = performance.now();
  }, true);
  new MutationObserver(() => {
    const thinking = document.querySelector('#chat .thought-group .message-content');
    const text = thinking ? thinking.innerText.trim() : '';
    if (marks.first === null && text !== '' && text !== '…') marks.first = performance.now();
    const stats = document.querySelector('#chat .reply-stats');
    if (marks.end === null && stats) { marks.end = performance.now(); marks.stats = stats.innerText; }
  }).observe(document.querySelector('#chat'), {childList: true, subtree: true, characterData: true});
}"""


def through_browser(browser, url: str) -> tuple[float, float, int]:
    """Type the question into a fresh page (a new conversation) and press Enter; the app was started with the
    same sampling settings as the other paths (`app_process`)."""
    page = browser.new_page()
    try:
        page.goto(url, wait_until="load")
        question = page.locator("#question textarea")
        question.wait_for()
        page.evaluate(_WATCH_REPLY)
        question.fill(QUESTION)
        question.press("Enter")
        page.wait_for_function("() => window.replyMarks.end !== null", timeout=120_000)
        marks = page.evaluate("() => window.replyMarks")
    finally:
        page.close()
    return figures(
        (marks["first"] - marks["enter"]) / 1000,
        (marks["end"] - marks["enter"]) / 1000,
        _reply_tokens(marks["stats"]),
    )


def measure_rounds(paths: dict, rounds: int) -> dict[str, list[tuple[float, float, int]]]:
    """One warm-up call per path (the app's first request costs more than later ones), then `rounds` calls of
    each, in turn."""
    for measure in paths.values():
        measure()
    results = {path: [] for path in paths}
    for _ in range(rounds):
        for path, measure in paths.items():
            results[path].append(measure())
    return results


@contextlib.contextmanager
def chromium():
    """Debian's chromium driven by Playwright, or None (with the reason) when either is missing."""
    executable = Path("/usr/bin/chromium")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        print("browser path skipped: playwright is not installed (pip install playwright)")
        yield None
        return
    if not executable.is_file():
        print(f"browser path skipped: {executable} is missing (apt-get install -y chromium)")
        yield None
        return
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(executable),
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--no-first-run"],
        )
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def app_process(endpoint, port: int, max_tokens: int):
    """`dapo-suite serve --endpoint URL` in its own process, as users run it, its page preset to greedy
    decoding."""
    command = [
        sys.executable,
        "-c",
        "from dapo_suite.cli import main; main()",
        "serve",
        "--endpoint",
        endpoint.base_url,
        "--model",
        endpoint.model_name,
        "--port",
        str(port),
        "--temperature",
        "0",
        "--top-p",
        "1",
        "--max-tokens",
        str(max_tokens),
    ]
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
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


@contextlib.contextmanager
def pinned_endpoint(model: str | None):
    """The embedded model server on the first CPU with one thread; this process (and what it starts later: the
    app, chromium) on the rest."""
    cpus = os.sched_getaffinity(0)
    if len(cpus) < 2:
        raise SystemExit("--pin-model-cpu needs at least two CPUs")
    model_cpu = min(cpus)
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    os.sched_setaffinity(0, {model_cpu})  # the server inherits both
    try:
        with start_endpoint(model, startup_timeout_s=600) as endpoint:
            os.sched_setaffinity(0, cpus - {model_cpu})
            if threads is None:
                del os.environ["OMP_NUM_THREADS"]
            else:
                os.environ["OMP_NUM_THREADS"] = threads
            print(
                f"model server on CPU {model_cpu} (1 thread); app, browser and clients on CPUs "
                f"{sorted(cpus - {model_cpu})}"
            )
            yield endpoint
    finally:
        os.sched_setaffinity(0, cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--endpoint", help="a running OpenAI-compatible server (default: start the embedded model)"
    )
    parser.add_argument("--model", help="model to serve, or with --endpoint the served model name")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--pin-model-cpu",
        action="store_true",
        help="start the model server alone on one CPU (one thread) and run the app, browser and "
        "clients on the others: separates what the app costs from competition for cores",
    )
    args = parser.parse_args()
    import openai
    from gradio_client import Client

    print(cpu_line())
    if args.endpoint:
        served = contextlib.nullcontext(connect_endpoint(args.endpoint, args.model))
    elif args.pin_model_cpu:
        served = pinned_endpoint(args.model)
    else:
        served = start_endpoint(args.model, startup_timeout_s=600)
    # Clients live across rounds, as a browser's connections and a program's openai client do: connection
    # set-up is not what is measured.
    with (
        served as endpoint,
        app_process(endpoint, free_port(), args.max_tokens) as url,
        httpx.Client(base_url=url, timeout=120) as http,
    ):
        openai_client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused", max_retries=0)
        client = Client(url, verbose=False)
        fn_index = next(
            d["id"] for d in httpx.get(url + "config").json()["dependencies"] if d["api_name"] == "chat"
        )
        direct_path = {"direct": lambda: direct(openai_client, endpoint, args.max_tokens)}
        results = measure_rounds(
            {
                **direct_path,
                "api": lambda: through_api(http, fn_index, args.max_tokens),
                "gradio_client": lambda: through_gradio_client(client, args.max_tokens),
            },
            args.rounds,
        )
        # The browser runs in a phase of its own, with its own direct baseline: an open chromium takes CPU
        # from the model server even between replies, and that should not count against the other clients.
        with chromium() as browser:
            if browser is not None:
                browser_results = measure_rounds(
                    {**direct_path, "browser": lambda: through_browser(browser, url)}, args.rounds
                )
                results["direct (browser open)"] = browser_results["direct"]
                results["browser"] = browser_results["browser"]
    median = {
        path: [statistics.median(column) for column in zip(*rows, strict=True)]
        for path, rows in results.items()
    }
    print(f"endpoint {endpoint.base_url}, {args.rounds} rounds, {args.max_tokens} max tokens, greedy")
    print(f"{'path':<22} {'first token (s)':>16} {'tokens/s':>10} {'tokens':>7}")
    for path, (ttft, speed, tokens) in median.items():
        print(f"{path:<22} {ttft:>16.3f} {speed:>10.2f} {tokens:>7.0f}")
    ratios = {}
    baselines = {"api": "direct", "gradio_client": "direct", "browser": "direct (browser open)"}
    for path, baseline in baselines.items():
        if path not in median:
            continue
        ttft_ratio = median[path][0] / median[baseline][0]
        speed_ratio = median[baseline][1] / median[path][1]
        ratios[path] = max(ttft_ratio, speed_ratio)
        added_ms = (median[path][0] - median[baseline][0]) * 1000
        print(
            f"{path:<14} / {baseline:<22}: time to first token {ttft_ratio:.3f} "
            f"({(ttft_ratio - 1) * 100:+.1f} %, {added_ms:+.0f} ms), "
            f"tokens/s {speed_ratio:.3f} ({(speed_ratio - 1) * 100:+.1f} %)"
        )
    verdict = "within" if ratios["api"] < 1.10 else "OVER"
    print(f"target: the app (its /chat API) adds under 10 % to either -> {verdict}")


if __name__ == "__main__":
    main()
