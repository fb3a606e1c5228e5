"""The front of `dapo-suite serve api`: an OpenAI-compatible HTTP server that guards the model server behind it.

`transformers serve` (or `vllm serve`) runs as a child on a private port (dapo_suite/endpoint.py); this front, on the
port users call, adds what the child lacks:
- `GET /v1/models` answers with the served model itself (the child's listing scans the Hugging Face cache and
  answers 500 on a machine where that cache does not exist yet);
- a request whose prompt is longer than the limit (default: the model's context minus the request's
  max_tokens) or whose max_tokens is not a positive integer that fits the context gets 400 at once, before the
  model sees it, so one oversized request cannot hold the model for minutes;
- the child always streams: when the client disconnects, the front closes the child's stream, and the child
  stops generating (it cancels a generation whose stream is closed). A non-streaming client gets the streamed
  pieces joined into one response.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx

DEFAULT_MAX_TOKENS = 1024  # what a request without max_tokens may generate (and what the prompt limit assumes)


@dataclass
class Limits:
    context: int  # the model's context window, in tokens
    max_prompt_tokens: int | None = None  # None: context - max_tokens of each request


def model_context(model_path: str) -> int:
    """The context window of a model directory or hub id (max_position_embeddings of its config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048))


def _error(status: int, message: str, param: str | None = None):
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": None}}, status_code=status)


def check_request(body: Any, chat: bool, count_tokens, limits: Limits) -> tuple[dict | None, tuple | None]:
    """(request to forward, None) or (None, (status, message, param)). Pure but for `count_tokens`."""
    if not isinstance(body, dict):
        return None, (400, "the request body must be a JSON object", None)
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    max_tokens = body.get(key, DEFAULT_MAX_TOKENS)
    if max_tokens is None:
        max_tokens = DEFAULT_MAX_TOKENS
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens < limits.context:
        return None, (400, f"{key}={max_tokens!r}: must be an integer from 1 to {limits.context - 1} (the model's "
                           f"context is {limits.context} tokens)", key)
    field = "messages" if chat else "prompt"
    if field not in body:
        return None, (400, f"the request has no {field}", field)
    try:
        prompt_tokens = count_tokens(body[field])
    except (TypeError, ValueError, KeyError, AttributeError) as error:
        return None, (400, f"{field} could not be read ({error})", field)
    limit = limits.max_prompt_tokens or limits.context - max_tokens
    if prompt_tokens > limit:
        return None, (400, f"the prompt is {prompt_tokens} tokens; this server takes at most {limit} "
                           f"(context {limits.context} - {key} {max_tokens}). Shorten the prompt or lower {key}.",
                      field)
    return {**body, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}, None


def make_app(upstream: str, model_name: str, tokenizer, limits: Limits):
    """The Starlette app; `upstream` is the child's base URL (ending in /v1)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))

    def count_chat(messages) -> int:
        return len(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True,
                                                 return_dict=False))

    def count_text(prompt) -> int:
        return len(tokenizer(prompt if isinstance(prompt, str) else "".join(prompt))["input_ids"])

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "dapo-suite"}]})

    async def health(_: Request) -> Response:
        try:
            answer = await client.get(upstream.removesuffix("/v1") + "/health", timeout=5.0)
        except httpx.HTTPError as error:
            return JSONResponse({"status": "unhealthy", "reason": str(error)}, status_code=503)
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    async def generate(request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the request body is not JSON")
        forward, problem = await asyncio.to_thread(check_request, body, chat, count_chat if chat else count_text,
                                                   limits)
        if problem:
            return _error(*problem)
        url = upstream + ("/chat/completions" if chat else "/completions")
        if body.get("stream"):
            return StreamingResponse(_relay(client, url, forward), media_type="text/event-stream")
        # Join the child's stream into one response, and close it as soon as the client has gone.
        joining = asyncio.ensure_future(_join(client, url, forward, chat))
        while not joining.done():
            if await request.is_disconnected():
                joining.cancel()
                return Response(status_code=499)
            await asyncio.wait({joining}, timeout=0.5)
        status, payload = joining.result()
        return JSONResponse(payload, status_code=status)

    routes = [Route("/v1/models", models), Route("/health", health),
              Route("/v1/chat/completions", generate, methods=["POST"]),
              Route("/v1/completions", generate, methods=["POST"])]
    @contextlib.asynccontextmanager
    async def lifespan(_app) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=routes, lifespan=lifespan)


async def _relay(client: httpx.AsyncClient, url: str, body: dict) -> AsyncIterator[bytes]:
    """The child's stream as it comes; leaving this generator (client gone) closes the child's stream."""
    async with client.stream("POST", url, json=body) as upstream:
        async for piece in upstream.aiter_raw():
            yield piece


async def _join(client: httpx.AsyncClient, url: str, body: dict, chat: bool) -> tuple[int, dict]:
    """(status, one OpenAI response) from the child's server-sent events."""
    text, finish, usage, model = [], "stop", None, body.get("model")
    async with client.stream("POST", url, json=body) as upstream:
        if upstream.status_code != 200:
            content = await upstream.aread()
            try:
                return upstream.status_code, json.loads(content)
            except ValueError:
                return upstream.status_code, {"error": {"message": content.decode(errors="replace")}}
        async for line in upstream.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            model = chunk.get("model", model)
            for choice in chunk.get("choices") or []:
                text.append((choice.get("delta") or {}).get("content") or "" if chat else choice.get("text") or "")
                finish = choice.get("finish_reason") or finish
    joined = "".join(text)
    choice = ({"index": 0, "message": {"role": "assistant", "content": joined}, "finish_reason": finish} if chat
              else {"index": 0, "text": joined, "finish_reason": finish, "logprobs": None})
    return 200, {"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
                 "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
                 "model": model, "choices": [choice], "usage": usage}


def serve_front(upstream: str, model_name: str, model_path: str, host: str, port: int,
                max_prompt_tokens: int | None = None, on_ready: Callable[[], None] = lambda: None) -> None:
    """Serve the front on host:port until SIGINT/SIGTERM. The socket is bound before `on_ready` runs, so a
    client that reads the printed URL and connects at once waits in the backlog instead of being refused."""
    import socket

    import uvicorn
    from transformers import AutoTokenizer

    app = make_app(upstream, model_name, AutoTokenizer.from_pretrained(model_path),
                   Limits(model_context(model_path), max_prompt_tokens))
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    on_ready()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
