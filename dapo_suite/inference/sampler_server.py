"""An OpenAI-compatible server on dapo-suite's own sampler, with continuous batching (`batching.BatchDecoder`):
the CPU engine of `dapo-suite serve api` (`--engine sampler`), started as a child by `endpoint.start_endpoint`.

    python -m dapo_suite.inference.sampler_server --model runs/dapo/checkpoint-last --port 8001

It answers `/v1/chat/completions` and `/v1/completions`, streamed or not, with `n` choices (choice i samples with
seed + i), with OpenAI's sampling: `temperature` (default 1; 0 is greedy),
`top_p` (default 1), `seed` (a request's own random stream), `max_tokens`, `stop`; `/health` and `/v1/models`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from dapo_suite.inference.openai_fields import RequestFieldError, sampling_fields

DEFAULT_MAX_TOKENS = 1024


class IncrementalText:
    """The text of a growing token sequence, piece by piece: a piece is released once its tokens decode to whole
    characters (a multi-byte character split over two tokens decodes to U+FFFD until its second token comes).
    Decodes only the tokens since the last released piece, so a long reply costs no more per token than a short
    one."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.tokens, self.prefix, self.read = tokenizer, [], 0, 0

    def push(self, token: int) -> str:
        self.tokens.append(token)
        done = self.tokenizer.decode(self.tokens[self.prefix : self.read], skip_special_tokens=True)
        text = self.tokenizer.decode(self.tokens[self.prefix :], skip_special_tokens=True)
        if len(text) <= len(done) or text.endswith("\ufffd"):
            return ""
        self.prefix, self.read = self.read, len(self.tokens)
        return text[len(done) :]


class StopStrings:
    """OpenAI's `stop`: the text is cut before the first stop string. Text that might be the start of one is
    held back until the next piece settles it."""

    def __init__(self, stops: list[str]) -> None:
        self.stops, self.held = [stop for stop in stops if stop], ""

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text to release, whether a stop string was reached)."""
        text = self.held + piece
        hits = [text.index(stop) for stop in self.stops if stop in text]
        if hits:
            self.held = ""
            return text[: min(hits)], True
        keep = max((size for stop in self.stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
                   default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


def error_response(status: int, message: str, param: str | None = None):
    """An OpenAI-shaped client error (`{"error": {"message", "type", "param", "code"}}`) with its HTTP status; the
    front (serve/api.py) answers with the same."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                   "code": None}}, status_code=status)


def _sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def make_app(decoder, tokenizer, model_name: str, context: int):
    """The Starlette app serving `decoder` (a `BatchDecoder`) under the name `model_name`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    from dapo_suite.core.prompts import render_chat
    from dapo_suite.inference.batching import GenerationJob

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(_: Request) -> Response:
        return JSONResponse({"object": "list", "data": [
            {"id": model_name, "object": "model", "created": 0, "owned_by": "dapo-suite"}]})

    async def generate(request: Request) -> Response:
        chat = request.url.path.endswith("/chat/completions")
        try:
            body = await request.json()
        except ValueError:
            return error_response(400, "the request body is not JSON")
        if not isinstance(body, dict):
            return error_response(400, "the request body must be a JSON object")
        try:
            fields = sampling_fields(body)
        except RequestFieldError as error:
            return error_response(400, str(error), error.param)
        try:
            if chat:
                ids = tokenizer(render_chat(tokenizer, body["messages"]), add_special_tokens=False)["input_ids"]
            else:
                prompt = body["prompt"]
                ids = tokenizer(prompt if isinstance(prompt, str) else "".join(prompt))["input_ids"]
        except (KeyError, TypeError, ValueError) as error:
            field = "messages" if chat else "prompt"
            return error_response(400, f"{field} could not be read ({error})", field)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_MAX_TOKENS
        if not isinstance(max_tokens, int) or max_tokens < 1 or len(ids) + max_tokens > context:
            return error_response(400, f"{len(ids)} prompt tokens + max_tokens {max_tokens!r} exceed the context of "
                               f"{context} tokens", "max_tokens")
        stop = body.get("stop") or []
        stop_list = [stop] if isinstance(stop, str) else list(stop)

        # The n choices are submitted together, so they start in one batch: a repeated request with a seed meets
        # the same batch (and, its prompt now cached, the same prompt cache) and gets the same choices.
        events: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        seed = fields.seed
        jobs = [GenerationJob(ids, max_tokens, fields.temperature, fields.top_p, None if seed is None else seed + index,
                              emit=lambda event, index=index: loop.call_soon_threadsafe(events.put_nowait,
                                                                                        (index, event)))
                for index in range(fields.n)]
        decoder.submit(*jobs)
        name = body.get("model") or model_name
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))
        reply_id, created = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())

        def chunk(index: int, text: str | None, finish: str | None, role: bool = False) -> dict:
            if chat:
                delta = ({"role": "assistant"} if role else {}) | ({} if text is None else {"content": text})
                choice = {"index": index, "delta": delta, "finish_reason": finish, "logprobs": None}
            else:
                choice = {"index": index, "text": text or "", "finish_reason": finish, "logprobs": None}
            return {"id": reply_id, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created, "model": name, "choices": [choice]}

        async def pieces() -> AsyncIterator[tuple[int, str, str]]:
            """(choice, "text", piece) as the choices decode, (choice, "finish", reason) as each ends, or
            (choice, "error", message)."""
            texts = [IncrementalText(tokenizer) for _ in jobs]
            stops = [StopStrings(stop_list) for _ in jobs]
            running = set(range(len(jobs)))
            try:
                while running:
                    index, (kind, value) = await events.get()
                    if index not in running:
                        continue  # a choice cut by a stop string: the rest of its events
                    if kind == "error":
                        yield index, "error", str(value)
                        return
                    finish = None
                    if kind == "end":
                        finish = "stop" if value == "cancelled" else str(value)
                    else:
                        piece, stopped = stops[index].feed(texts[index].push(int(value)))
                        if piece:
                            yield index, "text", piece
                        if stopped:
                            jobs[index].cancelled, finish = True, "stop"
                    if finish is not None:
                        running.discard(index)
                        if rest := stops[index].flush():
                            yield index, "text", rest
                        yield index, "finish", finish
            finally:
                for job in jobs:
                    job.cancelled = True  # the client has gone or the reply is complete: free the rows

        def usage() -> dict:
            produced = sum(job.produced for job in jobs)
            return {"prompt_tokens": len(ids), "completion_tokens": produced, "total_tokens": len(ids) + produced}

        def error_body(message: str) -> dict:
            return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}

        async def stream() -> AsyncIterator[bytes]:
            if chat:
                for index in range(len(jobs)):
                    yield _sse(chunk(index, "", None, role=True))
            async for index, kind, value in pieces():
                if kind == "error":
                    yield _sse(error_body(value))
                    return
                yield _sse(chunk(index, value, None) if kind == "text" else chunk(index, None, value))
            if usage_wanted:
                yield _sse({"id": reply_id, "object": "chat.completion.chunk" if chat else "text_completion",
                            "created": created, "model": name, "choices": [], "usage": usage()})
            yield b"data: [DONE]\n\n"

        if body.get("stream"):
            return StreamingResponse(stream(), media_type="text/event-stream")
        parts: list[list[str]] = [[] for _ in jobs]
        finishes = ["stop"] * len(jobs)
        async for index, kind, value in pieces():
            if kind == "error":
                return JSONResponse(error_body(value), status_code=500)
            if kind == "text":
                parts[index].append(value)
            else:
                finishes[index] = value
        replies = [
            {"index": index, "message": {"role": "assistant", "content": "".join(part)},
             "finish_reason": finish, "logprobs": None} if chat else
            {"index": index, "text": "".join(part), "finish_reason": finish, "logprobs": None}
            for index, (part, finish) in enumerate(zip(parts, finishes, strict=True))]
        return JSONResponse({"id": reply_id, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": name, "choices": replies, "usage": usage()})

    routes = [Route("/health", health), Route("/v1/models", models),
              Route("/v1/chat/completions", generate, methods=["POST"]),
              Route("/v1/completions", generate, methods=["POST"])]
    return Starlette(routes=routes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m dapo_suite.inference.sampler_server",
                                     description="OpenAI-compatible server on dapo-suite's sampler "
                                                 "(continuous batching; CPU).")
    parser.add_argument("--model", default=None, help="checkpoint dir, hub id, or omit for the embedded model")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-rows", type=int, default=64, help="requests decoded together at most")
    parser.add_argument("--kv-cache-gib", type=float, default=4.0, help="cache memory the batch may hold")
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="sampling precision; auto: bf16 where the CPU has native bf16, else float32")
    args = parser.parse_args(argv)

    import torch
    import uvicorn

    from dapo_suite.core.prompts import render_chat
    from dapo_suite.inference.batching import BatchDecoder
    from dapo_suite.inference.engines import end_of_response_ids
    from dapo_suite.inference.models import load_model_and_tokenizer, resolve_model, resolve_precision

    name = resolve_model(args.model)
    model, tokenizer = load_model_and_tokenizer(name, dtype="float32")
    model.eval()
    dtype = getattr(torch, resolve_precision(args.dtype) or "float32")
    decoder = BatchDecoder(model, end_of_response_ids(model, tokenizer), tokenizer.pad_token_id, dtype,
                           max_rows=args.max_rows, kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)))
    decoder.warm_up(tokenizer(render_chat(tokenizer, "Hello"), add_special_tokens=False)["input_ids"])
    context = int(getattr(model.config, "max_position_embeddings", 2048))
    uvicorn.run(make_app(decoder, tokenizer, name, context), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
