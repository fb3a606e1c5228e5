"""The front of `dapo-suite serve api`: an OpenAI-compatible HTTP server that guards the model server behind
it.

The model server runs as a child on a private port (dapo_suite/inference/endpoint.py): dapo-suite's batched
sampler on a CPU, `vllm serve` on a GPU, or `transformers serve`; this front, on the port users call, adds
what the child lacks:
- with `--api-key` (or DAPO_SUITE_API_KEY), a request to /v1 without `Authorization: Bearer KEY` gets 401 in
  OpenAI's error shape before anything else runs (`auth.RequireApiKey`);
- `GET /v1/models` answers with the served model's name (`SmolLM2-135M-Instruct`, a checkpoint's folder name,
  `--served-model-name`), whatever the Hugging Face cache holds (`transformers serve`'s own listing scans it
  and answers 500 where it does not exist yet); requests may name the model by that name or by its path;
- every request is checked, before the model sees it, by the parser the sampler server uses too
  (`openai_fields.parse_request`): what OpenAI refuses (empty `messages`, an unknown role, content that is not
  text, an unknown field, a prompt longer than the limit: by default the model's context minus the request's
  max_tokens) gets 400 naming the field, at once, so one oversized request cannot hold the model for minutes;
- log-probs (`logprobs`, `top_logprobs`, `echo`) pass to a child that gives them (the sampler, vLLM) and come
  back joined into one response for a non-streaming client; with `transformers serve`, which gives none, they
  get 400 naming the field;
- the child always streams: when the client disconnects, the front closes the child's stream, and the child
  stops generating (it cancels a generation whose stream is closed). A non-streaming client gets the streamed
  pieces joined into one response;
- `n` > 1 (several choices for one prompt, which `transformers serve` does not give) fans out, for that child,
  to n requests of one choice each (seed, when given, becomes seed + i for choice i, as the sampler's server
  does itself), whose choices come back as indices 0..n-1, in one response or interleaved in one stream;
- with `transformers serve`, sampling as an OpenAI client expects: it copies `temperature` and `top_p` into
  the model's generation config but never turns `do_sample` on, so every request decoded greedily. The front
  sends the whole generation config with each request (`generation_config`, the model's own with `do_sample` =
  temperature > 0, and OpenAI's defaults, temperature 1 and top_p 1, where the request gives none); `seed`
  makes it repeatable;
- OpenAI function calling (`tools`, `tool_choice`, `tool_calls`, `tool` messages) for every child, in the
  Hermes format: the tools are written into the messages the child gets, and the calls read out of its reply,
  whole or streamed (dapo_suite/inference/tool_calls.py);
- structured outputs (`response_format` json_object, json_schema) through the child's constrained decoding
  (the sampler's, vLLM's); `transformers serve` has none, and the field gets 400;
- a request naming a model this server does not serve gets 404 `model_not_found` before any stream starts, and
  every error, the child's included, has OpenAI's shape `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import httpx

from dapo_suite.inference.openai_fields import (
    ParsedRequest,
    error_response,
    openai_routes,
    parse_request,
    read_request,
)
from dapo_suite.inference.tool_calls import ToolCalling, ToolCallStream, with_tool_calls
from serve.auth import RequireApiKey


@dataclass
class Limits:
    context: int  # the model's context window, in tokens
    max_prompt_tokens: int | None = None  # None: context - max_tokens of each request


def model_context(model_path: str) -> int:
    """The context window of a model directory or hub id (max_position_embeddings of its config)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    return int(getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", 2048))


def with_sampling(body: dict, parsed: ParsedRequest, generation_defaults: dict) -> dict:
    """`body` with the generation config `transformers serve` should use: the model's own (end-of-turn tokens,
    ...), then OpenAI's meaning of the request as read: temperature > 0 samples, 0 decodes greedily; top_p;
    max_tokens new tokens."""
    temperature, top_p = parsed.sampling.temperature, parsed.sampling.top_p
    config = {**generation_defaults, "do_sample": temperature > 0, "max_new_tokens": parsed.max_tokens}
    config.update(
        {"temperature": temperature, "top_p": top_p, "top_k": 0}
        if temperature > 0
        else {"temperature": None, "top_p": None, "top_k": None}
    )
    return {**body, "generation_config": json.dumps(config)}


def fan_out(body: dict) -> list[dict]:
    """One single-choice request per choice of `body` (its `n`); choice i gets seed + i when a seed is given,
    so the choices differ and a repeated request repeats them."""
    seed = body.get("seed")
    return [
        {**body, "n": 1, **({"seed": seed + index} if isinstance(seed, int) else {})}
        for index in range(body["n"])
    ]


class Upstream:
    """The child server. `serial`: one request at a time. `transformers serve` seeds torch's global generator
    when a request arrives, while another may be generating: overlapping requests would draw from each other's
    stream and a seed would not repeat. It generates one request at a time anyway, so this costs no
    throughput."""

    def __init__(self, client: httpx.AsyncClient, serial: bool) -> None:
        self.client = client
        self.slot = asyncio.Semaphore(1) if serial else None

    @contextlib.asynccontextmanager
    async def stream(self, url: str, body: dict) -> AsyncIterator[httpx.Response]:
        async with self.slot or contextlib.nullcontext():
            async with self.client.stream("POST", url, json=body) as response:
                yield response


def make_app(
    upstream: str,
    model_name: str,
    tokenizer,
    limits: Limits,
    generation_defaults: dict | None = None,
    child_model: str | None = None,
    model_path: str | None = None,
    api_key: str | None = None,
):
    """The Starlette app; `upstream` is the child's base URL (ending in /v1), which knows the model as
    `child_model` (default `model_name`); requests may name `model_name` or `model_path`.
    `generation_defaults`: the model's generation config as a dict, sent with every request (see
    `with_sampling`): a `transformers serve` child, which gives no log-probs; None leaves the child's own
    handling (the sampler and `vllm serve` sample as OpenAI does). `api_key`: requests to /v1 must carry it
    (`auth.RequireApiKey`)."""
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse

    client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
    child = Upstream(client, serial=generation_defaults is not None)
    child_model = child_model or model_name
    names = tuple(dict.fromkeys(name for name in (model_name, child_model, model_path) if name))

    async def models(_: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "dapo-suite"}],
            }
        )

    async def health(_: Request) -> Response:
        try:
            answer = await client.get(upstream.removesuffix("/v1") + "/health", timeout=5.0)
        except httpx.HTTPError as error:
            return JSONResponse({"status": "unhealthy", "reason": str(error)}, status_code=503)
        return Response(answer.content, status_code=answer.status_code, media_type="application/json")

    def parse(body: dict, chat: bool) -> ParsedRequest:
        return parse_request(
            body,
            chat,
            tokenizer,
            limits.context,
            limits.max_prompt_tokens,
            generation_defaults is None,
            function_calling=True,
            structured_outputs=generation_defaults is None,  # the sampler and vLLM decode under a grammar
        )

    async def generate(request: Request) -> Response:
        parsed = await read_request(request, names, parse)
        if not isinstance(parsed, ParsedRequest):
            return parsed
        chat = parsed.chat
        if generation_defaults is not None and len(parsed.prompts) > 1:
            return error_response(400, "prompt: `transformers serve` takes one prompt per request", "prompt")
        forward = parsed.child_body(child_model)
        if generation_defaults is not None:
            forward = with_sampling(forward, parsed, generation_defaults)
        url = upstream + ("/chat/completions" if chat else "/completions")
        requests = fan_out(forward) if generation_defaults is not None else [forward]  # others give n choices
        if parsed.stream:
            stream = _relay(child, url, forward) if len(requests) == 1 else _interleave(child, url, requests)
            if parsed.tool_calling is not None:
                stream = _with_tool_calls(stream, parsed.tool_calling)
            return StreamingResponse(stream, media_type="text/event-stream")
        # Join the child's stream into one response, and close it as soon as the client has gone.
        joining = asyncio.ensure_future(_join_all(child, url, requests, chat, parsed.model or model_name))
        while not joining.done():
            if await request.is_disconnected():
                joining.cancel()
                return Response(status_code=499)
            await asyncio.wait({joining}, timeout=0.5)
        status, payload = joining.result()
        if status == 200 and parsed.tool_calling is not None:
            payload = with_tool_calls(payload, parsed.tool_calling)
        return JSONResponse(payload, status_code=status)

    routes = openai_routes(health, models, generate)

    @contextlib.asynccontextmanager
    async def lifespan(_app) -> AsyncIterator[None]:
        yield
        await client.aclose()

    guard = [Middleware(RequireApiKey, api_key=api_key)] if api_key else []
    return Starlette(routes=routes, lifespan=lifespan, middleware=guard)


def openai_error(content: bytes) -> dict:
    """A child's error body in OpenAI's shape (FastAPI answers `{"detail": ...}`)."""
    try:
        payload = json.loads(content)
    except ValueError:
        payload = content.decode(errors="replace")
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        return payload
    message = payload.get("detail", payload) if isinstance(payload, dict) else payload
    return {"error": {"message": str(message), "type": "invalid_request_error", "param": None, "code": None}}


async def _relay(child: Upstream, url: str, body: dict) -> AsyncIterator[bytes]:
    """The child's stream as it comes (an error as one OpenAI-shaped event); leaving this generator (client
    gone) closes the child's stream. The front's own checks (model, limits) answer with a status before any
    stream."""
    async with child.stream(url, body) as upstream:
        if upstream.status_code != 200:
            yield b"data: " + json.dumps(openai_error(await upstream.aread())).encode() + b"\n\n"
            return
        async for piece in upstream.aiter_raw():
            yield piece


async def _with_tool_calls(stream: AsyncIterator[bytes], calling: ToolCalling) -> AsyncIterator[bytes]:
    """A chat stream with each choice's calls read out of its text (`tool_calls.ToolCallStream`): content
    deltas until a call starts, then, where the choice ends, its calls as one `tool_calls` delta and
    finish_reason "tool_calls" (or the text held back, when it was no call)."""
    readers: dict[int, ToolCallStream] = {}
    buffer = b""
    async for piece in stream:
        buffer += piece
        *events, buffer = buffer.split(b"\n\n")
        for event in events:
            line = event.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                yield event + b"\n\n"
                continue
            chunk = json.loads(line[5:])
            choices = chunk.get("choices") or []
            for choice in choices:
                reader = readers.setdefault(choice.get("index", 0), ToolCallStream(calling))
                delta = choice.get("delta") or {}
                if "content" in delta:
                    delta["content"] = reader.push(delta["content"] or "")
                if choice.get("finish_reason") is not None:
                    rest, calls = reader.finish()
                    if calls:
                        delta["tool_calls"] = [{"index": number, **call} for number, call in enumerate(calls)]
                        if choice["finish_reason"] != "length":
                            choice["finish_reason"] = "tool_calls"
                    elif rest:
                        delta["content"] = delta.get("content", "") + rest
                choice["delta"] = delta
            yield f"data: {json.dumps(chunk)}\n\n".encode()
    if buffer.strip():
        yield buffer


async def _interleave(child: Upstream, url: str, bodies: list[dict]) -> AsyncIterator[bytes]:
    """The streams of several single-choice requests as one stream, each chunk's choice renumbered to its
    request's index; leaving this generator (client gone) cancels every request."""
    queue: asyncio.Queue[bytes | None] = asyncio.Queue()

    async def pump(index: int, body: dict) -> None:
        try:
            async with child.stream(url, body) as upstream:
                if upstream.status_code != 200:
                    await queue.put(
                        b"data: " + json.dumps(openai_error(await upstream.aread())).encode() + b"\n\n"
                    )
                    return
                async for line in upstream.aiter_lines():
                    if not line.startswith("data:") or line.strip() == "data: [DONE]":
                        continue
                    chunk = json.loads(line[5:])
                    for choice in chunk.get("choices") or []:
                        choice["index"] = index
                    await queue.put(f"data: {json.dumps(chunk)}\n\n".encode())
        finally:
            await queue.put(None)

    pumps = [asyncio.create_task(pump(index, body)) for index, body in enumerate(bodies)]
    try:
        running = len(pumps)
        while running:
            piece = await queue.get()
            if piece is None:
                running -= 1
            else:
                yield piece
        yield b"data: [DONE]\n\n"
    finally:
        for task in pumps:
            task.cancel()


async def _join_all(
    child: Upstream, url: str, bodies: list[dict], chat: bool, model: str
) -> tuple[int, dict]:
    """(status, one OpenAI response) holding the choices of one request, or of several single-choice requests
    renumbered 0..n-1; the first failed request's answer when one fails. Usage: the prompt once, the
    completions summed."""
    answers = await asyncio.gather(*(_join(child, url, body, chat, model) for body in bodies))
    for status, payload in answers:
        if status != 200:
            return status, payload
    payload = answers[0][1]
    if len(answers) == 1:
        return 200, payload
    payload["choices"] = [
        {**answer["choices"][0], "index": index} for index, (_, answer) in enumerate(answers)
    ]
    usages = [answer.get("usage") for _, answer in answers]
    if all(usages):
        completion = sum(usage.get("completion_tokens", 0) for usage in usages)
        prompt = usages[0].get("prompt_tokens", 0)
        payload["usage"] = {**usages[0], "completion_tokens": completion, "total_tokens": prompt + completion}
    return 200, payload


def _add_logprobs(joined: dict | None, more: dict | None) -> dict | None:
    """A choice's log-probs so far with one more chunk's: chat's `content` list and the legacy completions'
    four lists grow, token by token."""
    if not more:
        return joined
    joined = joined or {}
    for key, value in more.items():
        if isinstance(value, list):
            joined.setdefault(key, []).extend(value)
        else:
            joined.setdefault(key, value)
    return joined


async def _join(child: Upstream, url: str, body: dict, chat: bool, model: str) -> tuple[int, dict]:
    """(status, one OpenAI response) from the child's server-sent events, a choice per index streamed."""
    texts: dict[int, list[str]] = {}
    finishes: dict[int, str] = {}
    logprobs: dict[int, dict | None] = {}
    usage = None
    async with child.stream(url, body) as upstream:
        if upstream.status_code != 200:
            return upstream.status_code, openai_error(await upstream.aread())
        async for line in upstream.aiter_lines():
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                index = choice.get("index", 0)
                piece = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                texts.setdefault(index, []).append(piece or "")
                finishes[index] = choice.get("finish_reason") or finishes.get(index, "stop")
                logprobs[index] = _add_logprobs(logprobs.get(index), choice.get("logprobs"))
    choices = [
        {
            "index": index,
            "message": {"role": "assistant", "content": "".join(texts[index])},
            "finish_reason": finishes[index],
            "logprobs": logprobs[index],
        }
        if chat
        else {
            "index": index,
            "text": "".join(texts[index]),
            "finish_reason": finishes[index],
            "logprobs": logprobs[index],
        }
        for index in sorted(texts)
    ]
    return 200, {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": usage,
    }


def generation_defaults(model_path: str) -> dict:
    """The model's generation config as a dict (the library's defaults where the model ships none)."""
    from transformers import GenerationConfig

    try:
        config = GenerationConfig.from_pretrained(model_path)
    except OSError:
        config = GenerationConfig()
    return config.to_diff_dict()


def serve_front(
    upstream: str,
    model_name: str,
    model_path: str,
    host: str,
    port: int,
    max_prompt_tokens: int | None = None,
    on_ready: Callable[[], None] = lambda: None,
    engine: str = "transformers",
    child_model: str | None = None,
    api_key: str | None = None,
) -> None:
    """Serve the front on host:port until SIGINT/SIGTERM, listing the model as `model_name` (the child knows
    it as `child_model`), to clients that send `api_key` when one is given. The socket is bound before
    `on_ready` runs, so a client that reads the printed URL and connects at once waits in the backlog instead
    of being refused."""
    import socket

    import uvicorn
    from transformers import AutoTokenizer

    app = make_app(
        upstream,
        model_name,
        AutoTokenizer.from_pretrained(model_path),
        Limits(model_context(model_path), max_prompt_tokens),
        generation_defaults(model_path) if engine == "transformers" else None,
        child_model,
        model_path,
        api_key,
    )
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    on_ready()
    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
