"""A scripted OpenAI-compatible server for fault injection and latency benchmarks, never a stand-in for a
model: every reply is "Answer: 42" after `latency` seconds; `failures` lists HTTP status codes to return, in
order, before requests succeed (shared across requests). Used by tests/test_eval_openai.py and
benchmarks/eval_throughput.py.

    with scripted_server(latency=0.1, failures=[429, 503]) as (url, stats): ...
"""


import asyncio
import socket
import threading
import time
from contextlib import contextmanager


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def build_app(latency: float, failures: list[int], stats: dict):
    """A bare Starlette app (no FastAPI validation: the server must cost far less than the client under test)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    lock = threading.Lock()

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "scripted", "object": "model"}]})

    async def chat(request):
        body = await request.json()
        with lock:
            stats["requests"] += 1
            stats["in_flight"] += 1
            stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
            status = failures.pop(0) if failures else None
        try:
            await asyncio.sleep(latency)
            if status is not None:
                return JSONResponse({"error": {"message": f"scripted {status}"}}, status_code=status)
            stats["completed"] += 1
            return JSONResponse({
                "id": f"scripted-{stats['requests']}", "object": "chat.completion", "created": int(time.time()),
                "model": body.get("model", "scripted"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": "Answer: 42"}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
            })
        finally:
            with lock:
                stats["in_flight"] -= 1

    return Starlette(routes=[Route("/v1/models", models), Route("/v1/chat/completions", chat, methods=["POST"])])


@contextmanager
def scripted_server(latency: float = 0.0, failures: list[int] | None = None):
    """Serve on 127.0.0.1 in a thread; yields (base URL ending in /v1, live stats dict)."""
    import uvicorn

    stats = {"requests": 0, "completed": 0, "in_flight": 0, "max_in_flight": 0}
    port = free_port()
    config = uvicorn.Config(build_app(latency, list(failures or []), stats), host="127.0.0.1", port=port,
                            log_level="warning", backlog=4096, limit_concurrency=None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline or not thread.is_alive():
            raise RuntimeError("the scripted server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1", stats
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@contextmanager
def scripted_server_process(latency: float = 0.0):
    """The same server in its own process (so the client under test does not share its GIL); yields the URL."""
    import subprocess
    import sys

    import httpx

    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", "eval.scripted_server", "--port", str(port),
                                "--latency", str(latency)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.time() + 60
        while True:
            try:
                if httpx.get(f"{url}/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if process.poll() is not None or time.time() > deadline:
                raise RuntimeError("the scripted server process did not start")
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=10)


if __name__ == "__main__":
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description="Scripted OpenAI-compatible server (fixed latency).")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    uvicorn.run(build_app(args.latency, [], {"requests": 0, "completed": 0, "in_flight": 0, "max_in_flight": 0}),
                host="127.0.0.1", port=args.port, log_level="warning", backlog=4096)
