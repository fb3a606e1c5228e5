"""The chat app, driven with gradio_client as a user's browser would drive it: against `transformers serve` on
the embedded model for streaming, stop and the limits; against a dead child and a stalling scripted server for
the failure messages (fault injection only)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time

import httpx
import pytest

from dapo_suite.core.ports import free_port
from dapo_suite.inference.endpoint import Endpoint, start_endpoint
from serve.app import build_app, launch_kwargs
from serve.config import ServeConfig

pytest.importorskip("gradio_client")
from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

QUESTION = "What is 7 + 5?"  # greedy SmolLM2-135M with the DAPO prompt ends "... Answer: 12" in ~40 tokens


@contextlib.contextmanager
def running_app(config: ServeConfig, endpoint: Endpoint):
    """Launch the app on 127.0.0.1 in this process; yields (url, gradio_client.Client); closes it
    afterwards."""
    demo = build_app(config, endpoint)
    demo.queue(default_concurrency_limit=config.concurrency_limit, max_size=config.max_queue)
    demo.launch(prevent_thread_lock=True, quiet=True, **launch_kwargs(config))
    url = f"http://127.0.0.1:{config.port}/"
    try:
        yield url, Client(url, verbose=False)
    finally:
        demo.close()


@pytest.fixture(scope="module")
def endpoint():
    # float32: the greedy reply this file expects ("... Answer: 12" in ~40 tokens) is the same on every CPU;
    # with bf16 (auto on AVX-512 BF16) the text differs
    with start_endpoint(None, startup_timeout_s=300, dtype="float32") as running:
        yield running


@pytest.fixture(scope="module")
def app(endpoint):
    config = ServeConfig(port=free_port(), max_tokens=48, max_prompt_chars=2000, request_timeout_s=120)
    with running_app(config, endpoint) as (url, client):
        yield url, client


def test_reply_streams_into_thinking_then_answer_with_figures(app):
    _, client = app
    job = client.submit(QUESTION, 0.0, 0.7, 48, True, api_name="/chat")
    updates = [list(update) for update in job]
    final = job.outputs()[-1]
    assert len(job.outputs()) >= 4, "tokens should arrive as several updates, not one reply at the end"
    assert len(updates) >= 2
    pending = job.outputs()[1][0]
    assert pending["metadata"]["title"] == "Thinking" and pending["metadata"]["status"] == "pending"
    thinking, answer = final[0], final[-1]
    assert thinking["metadata"]["status"] == "done" and thinking["content"]
    assert "tokens/s" in answer["content"] and "first token" in answer["content"]
    assert "**Answer:** 12" in answer["content"] and "badge-integer" in answer["content"]


def test_stop_cancels_a_reply_and_the_app_keeps_serving(app):
    _, client = app
    job = client.submit("Explain in detail how to add fractions.", 1.0, 0.7, 400, False, api_name="/chat")
    deadline = time.monotonic() + 60
    while len(job.outputs()) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(job.outputs()) >= 2, "no streamed update within 60 s"
    started = time.monotonic()
    job.cancel()
    while not job.done() and time.monotonic() - started < 10:
        time.sleep(0.1)
    assert job.done(), "a stopped reply should end within seconds"
    streamed = len(job.outputs())
    time.sleep(1.0)
    assert len(job.outputs()) == streamed, "a stopped reply must not keep streaming"
    after = client.predict("What is 2+3?", 0.0, 0.7, 16, False, api_name="/chat")
    assert after[0]["metadata"]["status"] == "done"


def test_too_long_prompt_is_refused_with_the_limit(app):
    _, client = app
    with pytest.raises(AppError, match=r"2,001 characters; the limit is 2,000"):
        client.predict("x" * 2001, 1.0, 0.7, 16, True, api_name="/chat")


@pytest.mark.parametrize(
    "route",
    [
        "gradio_api/file=/etc/passwd",
        "file=/etc/passwd",
        "gradio_api/file=../../../../etc/passwd",
        "gradio_api/file=%2Fetc%2Fpasswd",
    ],
)
def test_no_route_reads_arbitrary_files(app, route):
    url, _ = app
    response = httpx.get(url + route, timeout=10)
    assert "root:" not in response.text
    assert response.status_code in (403, 404)


def test_crashed_model_server_gives_a_clear_message_not_a_hang(tmp_path):
    """A child that died (here: exit 3 after printing its error) and no longer answers on its port."""
    log = tmp_path / "server.log"
    with log.open("w") as sink:
        child = subprocess.Popen(
            [sys.executable, "-c", "print('RuntimeError: CUDA out of memory'); raise SystemExit(3)"],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    child.wait(10)
    dead = Endpoint(f"http://127.0.0.1:{free_port()}/v1", "embedded", child, "transformers", log)
    config = ServeConfig(port=free_port(), request_timeout_s=10)
    with running_app(config, dead) as (_, client):
        started = time.monotonic()
        with pytest.raises(AppError, match=r"exited with code 3[\s\S]*CUDA out of memory"):
            client.predict(QUESTION, 1.0, 0.7, 16, True, api_name="/chat")
        assert time.monotonic() - started < 15


@contextlib.contextmanager
def stalling_stream_server():
    """Scripted OpenAI-compatible server: streams one token, then goes silent (a wedged model server)."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def chat(request):
        async def events():
            chunk = {
                "id": "s",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "scripted",
                "choices": [{"index": 0, "delta": {"role": "assistant", "content": "Let"}}],
            }
            yield f"data: {json.dumps(chunk)}\n\n"
            await asyncio.sleep(3600)

        return StreamingResponse(events(), media_type="text/event-stream")

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = server.force_exit = True
        thread.join(timeout=5)


def test_silent_server_is_cut_off_by_the_request_timeout():
    with stalling_stream_server() as base_url:
        config = ServeConfig(port=free_port(), request_timeout_s=2.0)
        with running_app(config, Endpoint(base_url, "scripted")) as (_, client):
            started = time.monotonic()
            final = client.predict(QUESTION, 1.0, 0.7, 16, True, api_name="/chat")
            assert time.monotonic() - started < 15
    assert final[0]["content"] == "Let"
    assert "cut off" in final[-1]["content"] and "not answering" in final[-1]["content"]
