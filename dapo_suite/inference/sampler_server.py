"""An OpenAI-compatible server on dapo-suite's own sampler, with continuous batching
(`batching.BatchDecoder`): the CPU engine of `dapo-suite serve api` (`--engine sampler`), started as a child
by `endpoint.start_endpoint`.

    python -m dapo_suite.inference.sampler_server --model runs/dapo/checkpoint-last --port 8001

It answers `/v1/chat/completions` and `/v1/completions`, streamed or not, with `n` choices (choice i samples
with seed + i), with OpenAI's sampling: `temperature` (default 1; 0 is greedy),
`top_p` (default 1), `seed` (a request's own random stream), `max_tokens`, `stop`; log-probs (chat's
`logprobs` and `top_logprobs`, completions' `logprobs` and `echo`, of softmax(logits / T) before top_p);
`/health` and `/v1/models` (the served name; requests may name the model by it or by its path). Requests are
checked by `openai_fields.parse_request`.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dapo_suite.inference.openai_fields import ParsedRequest, openai_routes, parse_request, read_request

if TYPE_CHECKING:
    from dapo_suite.inference.sampling import TokenLogProb
    from dapo_suite.inference.structured import Grammars


class IncrementalText:
    """The text of a growing token sequence, piece by piece: a piece is released once its tokens decode to
    whole characters (a multi-byte character split over two tokens decodes to U+FFFD until its second token
    comes). Decodes only the tokens since the last released piece, so a long reply costs no more per token
    than a short one."""

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
        keep = max(
            (size for stop in self.stops for size in range(1, len(stop)) if text.endswith(stop[:size])),
            default=0,
        )
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep], False

    def flush(self) -> str:
        held, self.held = self.held, ""
        return held


def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet reversed: the character a byte-level BPE token spells each byte with."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    chars, shifted = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + shifted)] = byte
            shifted += 1
    return chars


class LogProbShapes:
    """Log-probs in OpenAI's response shapes: chat's `{content: [{token, logprob, bytes, top_logprobs}]}` and
    the legacy completions' `{tokens, token_logprobs, top_logprobs, text_offset}`. A token's `bytes` are its
    own bytes (a byte-level BPE token may hold half of a character, which its decoded text cannot show)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.bytes_of = tokenizer, _byte_decoder()
        self.cache: dict[int, tuple[str, list[int]]] = {}

    def token(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self.cache:
            text = self.tokenizer.decode([token_id])
            spelled = self.tokenizer.convert_ids_to_tokens(token_id)
            raw = (
                [self.bytes_of[char] for char in spelled]
                if all(char in self.bytes_of for char in spelled)
                else list(text.encode())
            )
            self.cache[token_id] = (text, raw)
        return self.cache[token_id]

    def chat(self, entries: list[tuple[int, TokenLogProb | None, int]]) -> dict:
        content = []
        for token_id, (log_prob, alternatives), _ in entries:
            text, raw = self.token(token_id)
            content.append(
                {
                    "token": text,
                    "logprob": log_prob,
                    "bytes": raw,
                    "top_logprobs": [
                        {"token": self.token(other)[0], "logprob": value, "bytes": self.token(other)[1]}
                        for other, value in alternatives
                    ],
                }
            )
        return {"content": content}

    def completion(self, entries: list[tuple[int, TokenLogProb | None, int]]) -> dict:
        """A prompt's first token (echo) has no log-prob: None, as OpenAI gives it. Each token's top_logprobs
        holds its alternatives and the token itself, as vLLM gives them."""
        shaped: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, scored, offset in entries:
            shaped["tokens"].append(self.token(token_id)[0])
            shaped["text_offset"].append(offset)
            if scored is None:
                shaped["token_logprobs"].append(None)
                shaped["top_logprobs"].append(None)
                continue
            log_prob, alternatives = scored
            shaped["token_logprobs"].append(log_prob)
            top = {self.token(other)[0]: value for other, value in alternatives}
            shaped["top_logprobs"].append(top | {self.token(token_id)[0]: log_prob})
        return shaped


class ChoiceText:
    """One choice's text as its tokens come: whole characters, cut before a stop string, each token's log-prob
    entry (token id, log-prob, text offset) held until the text it spells is released. `offset`: the
    characters before this choice's first token (the echoed prompt's)."""

    def __init__(self, tokenizer, stops: list[str], offset: int = 0) -> None:
        self.text, self.stops, self.offset = IncrementalText(tokenizer), StopStrings(stops), offset
        self.pending: list[tuple[int, TokenLogProb | None, int]] = []

    def push(self, token: int, scored: TokenLogProb | None) -> tuple[str, bool]:
        """(text to release, whether a stop string was reached)."""
        self.pending.append((token, scored, self.offset))
        piece = self.text.push(token)
        self.offset += len(piece)
        return self.stops.feed(piece)

    def take(self) -> list[tuple[int, TokenLogProb | None, int]]:
        entries, self.pending = self.pending, []
        return entries


def _sse(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


@dataclass
class Piece:
    """What one choice gives next: text (with the log-prob entries of the tokens it spells), its end, or an
    error."""

    index: int
    text: str = ""
    entries: list = field(default_factory=list)
    finish: str | None = None
    error: str | None = None


class Reply:
    """One request being answered: its jobs in the decoder (`n` per prompt, submitted together), the events
    they emit, and the OpenAI reply built from them, streamed (`stream`) or whole (`whole`)."""

    def __init__(
        self,
        parsed: ParsedRequest,
        tokenizer,
        shapes: LogProbShapes,
        model_name: str,
        echoes: list[tuple[str, list]],
        grammars: Callable[[], Grammars] | None = None,
    ) -> None:
        from dapo_suite.inference.batching import GenerationJob  # torch: only where a server runs

        self.parsed, self.tokenizer, self.shapes, self.echoes = parsed, tokenizer, shapes, echoes
        self.chat, self.wanted = parsed.chat, parsed.top_logprobs is not None
        self.name = parsed.model or model_name
        self.id, self.created = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}", int(time.time())
        self.events: asyncio.Queue = asyncio.Queue()
        loop, fields, n = asyncio.get_running_loop(), parsed.sampling, parsed.sampling.n
        self.jobs = [
            GenerationJob(
                ids,
                parsed.max_tokens,
                fields.temperature,
                fields.top_p,
                None if fields.seed is None else fields.seed + choice,
                top_logprobs=parsed.top_logprobs,
                ignore_eos=parsed.ignore_eos,
                constraint=grammars().constraint(parsed.response_format) if parsed.response_format else None,
                emit=lambda event, index=prompt * n + choice: loop.call_soon_threadsafe(
                    self.events.put_nowait, (index, event)
                ),
            )
            for prompt, ids in enumerate(parsed.prompts)
            for choice in range(n)
        ]

    def logprobs(self, entries: list) -> dict | None:
        return (self.shapes.chat if self.chat else self.shapes.completion)(entries) if self.wanted else None

    def chunk(self, piece: Piece, role: bool = False) -> dict:
        logprobs = self.logprobs(piece.entries) if piece.entries else None
        if self.chat:
            delta = ({"role": "assistant"} if role else {}) | (
                {"content": piece.text} if piece.text or role else {}
            )
            choice = {
                "index": piece.index,
                "delta": delta,
                "finish_reason": piece.finish,
                "logprobs": logprobs,
            }
        else:
            choice = {
                "index": piece.index,
                "text": piece.text,
                "finish_reason": piece.finish,
                "logprobs": logprobs,
            }
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.name,
            "choices": [choice],
        }

    def usage(self) -> dict:
        prompt = sum(len(ids) for ids in self.parsed.prompts)
        produced = sum(job.produced for job in self.jobs)
        return {"prompt_tokens": prompt, "completion_tokens": produced, "total_tokens": prompt + produced}

    async def pieces(self) -> AsyncIterator[Piece]:
        """Each choice's pieces as the choices decode, then its end (or an error)."""
        n, jobs = self.parsed.sampling.n, self.jobs
        choices = [
            ChoiceText(
                self.tokenizer, self.parsed.stop, len(self.echoes[index // n][0]) if self.echoes else 0
            )
            for index in range(len(jobs))
        ]
        for index in range(len(jobs)) if self.echoes else []:
            yield Piece(index, *self.echoes[index // n])
        if not self.parsed.max_tokens:
            for index in range(len(jobs)):
                yield Piece(index, finish="length")
            return
        running = set(range(len(jobs)))
        try:
            while running:
                index, (kind, value) = await self.events.get()
                if index not in running:
                    continue  # a choice cut by a stop string: the rest of its events
                if kind == "error":
                    yield Piece(index, error=str(value))
                    return
                choice, finish = choices[index], None
                if kind == "end":
                    finish = "stop" if value == "cancelled" else str(value)
                else:
                    job = jobs[index]  # its k-th token event goes with its k-th log-prob
                    scored = job.logprobs[len(choice.text.tokens)] if self.wanted else None
                    piece, stopped = choice.push(int(value), scored)
                    if piece:
                        yield Piece(index, piece, choice.take())
                    if stopped:
                        job.cancelled, finish = True, "stop"
                if finish is not None:
                    running.discard(index)
                    rest, entries = choice.stops.flush(), choice.take()
                    if rest or entries:
                        yield Piece(index, rest, entries)
                    yield Piece(index, finish=finish)
        finally:
            for job in jobs:
                job.cancelled = True  # the client has gone or the reply is complete: free the rows

    async def stream(self) -> AsyncIterator[bytes]:
        """The reply as server-sent events: a role chunk per chat choice, the pieces, usage when asked,
        [DONE]."""
        if self.chat:
            for index in range(len(self.jobs)):
                yield _sse(self.chunk(Piece(index), role=True))
        async for piece in self.pieces():
            if piece.error is not None:
                yield _sse(_server_error(piece.error))
                return
            yield _sse(self.chunk(piece))
        if self.parsed.include_usage:
            yield _sse(
                {
                    "id": self.id,
                    "object": "chat.completion.chunk" if self.chat else "text_completion",
                    "created": self.created,
                    "model": self.name,
                    "choices": [],
                    "usage": self.usage(),
                }
            )
        yield b"data: [DONE]\n\n"

    async def whole(self) -> tuple[int, dict]:
        """(status, the reply as one response): every choice's pieces joined."""
        parts: list[list[str]] = [[] for _ in self.jobs]
        entries: list[list] = [[] for _ in self.jobs]
        finishes = ["stop"] * len(self.jobs)
        async for piece in self.pieces():
            if piece.error is not None:
                return 500, _server_error(piece.error)
            parts[piece.index].append(piece.text)
            entries[piece.index].extend(piece.entries)
            finishes[piece.index] = piece.finish or finishes[piece.index]
        replies = [
            {
                "index": index,
                "message": {"role": "assistant", "content": "".join(part)},
                "finish_reason": finish,
                "logprobs": self.logprobs(entry),
            }
            if self.chat
            else {
                "index": index,
                "text": "".join(part),
                "finish_reason": finish,
                "logprobs": self.logprobs(entry),
            }
            for index, (part, entry, finish) in enumerate(zip(parts, entries, finishes, strict=True))
        ]
        return 200, {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.name,
            "choices": replies,
            "usage": self.usage(),
        }


def _server_error(message: str) -> dict:
    return {"error": {"message": message, "type": "server_error", "param": None, "code": None}}


async def echoed_prompts(decoder, tokenizer, parsed: ParsedRequest) -> list[tuple[str, list]]:
    """`echo`: each prompt's text and, with logprobs, its tokens' log-probs from one forward pass; [] without
    echo."""
    echoes = []
    for ids in parsed.prompts if parsed.echo else []:
        scored = (
            await asyncio.to_thread(
                decoder.score_prompt, ids, parsed.sampling.temperature, parsed.top_logprobs
            )
            if parsed.top_logprobs is not None
            else [None] * (len(ids) - 1)
        )
        echo = ChoiceText(tokenizer, [])
        texts = [echo.push(token, score)[0] for token, score in zip(ids, [None, *scored], strict=True)]
        echoes.append(("".join(texts), echo.take()))
    return echoes


def make_app(decoder, tokenizer, model_name: str, context: int, model_path: str | None = None):
    """The Starlette app serving `decoder` (a `BatchDecoder`) under the name `model_name` (requests may also
    name `model_path`)."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse

    names = (model_name, *([model_path] if model_path else []))
    shapes = LogProbShapes(tokenizer)

    @functools.cache
    def grammars() -> Grammars:  # built at the first structured request: it reads the whole vocabulary
        from dapo_suite.inference.structured import Grammars

        return Grammars(tokenizer, decoder.model.config.vocab_size)

    async def health(_: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(_: Request) -> Response:
        return JSONResponse(
            {
                "object": "list",
                "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "dapo-suite"}],
            }
        )

    async def generate(request: Request) -> Response:
        parsed = await read_request(
            request,
            names,
            lambda body, chat: parse_request(body, chat, tokenizer, context, structured_outputs=True),
        )
        if not isinstance(parsed, ParsedRequest):
            return parsed
        echoes = await echoed_prompts(decoder, tokenizer, parsed)
        reply = Reply(parsed, tokenizer, shapes, model_name, echoes, grammars)
        # The n choices are submitted together, so they start in one batch: a repeated request with a seed
        # meets the same batch (and, its prompt now cached, the same prompt cache) and gets the same choices.
        if parsed.max_tokens:
            decoder.submit(*reply.jobs)
        if parsed.stream:
            return StreamingResponse(reply.stream(), media_type="text/event-stream")
        status, payload = await reply.whole()
        return JSONResponse(payload, status_code=status)

    routes = openai_routes(health, models, generate)
    return Starlette(routes=routes)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m dapo_suite.inference.sampler_server",
        description="OpenAI-compatible server on dapo-suite's sampler (continuous batching; CPU).",
    )
    parser.add_argument(
        "--model", default=None, help="checkpoint dir, hub id, or omit for the embedded model"
    )
    parser.add_argument(
        "--served-model-name",
        default=None,
        help="the name /v1/models lists (default: the model's folder name; requests may also use its path)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--max-rows", type=int, default=64, help="requests decoded together at most")
    parser.add_argument("--kv-cache-gib", type=float, default=4.0, help="cache memory the batch may hold")
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=("auto", "float32", "bfloat16"),
        help="sampling precision; auto: bf16 where the CPU has native bf16, else float32",
    )
    args = parser.parse_args(argv)

    import torch
    import uvicorn

    from dapo_suite.core.prompts import render_chat
    from dapo_suite.inference.batching import BatchDecoder
    from dapo_suite.inference.engines import end_of_response_ids
    from dapo_suite.inference.models import (
        load_model_and_tokenizer,
        resolve_model,
        resolve_precision,
        served_model_name,
    )

    name = resolve_model(args.model)
    model, tokenizer = load_model_and_tokenizer(name, dtype="float32")
    model.eval()
    dtype = getattr(torch, resolve_precision(args.dtype) or "float32")
    decoder = BatchDecoder(
        model,
        end_of_response_ids(model, tokenizer),
        tokenizer.pad_token_id,
        dtype,
        max_rows=args.max_rows,
        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)),
    )
    decoder.warm_up(tokenizer(render_chat(tokenizer, "Hello"), add_special_tokens=False)["input_ids"])
    context = int(getattr(model.config, "max_position_embeddings", 2048))
    app = make_app(decoder, tokenizer, args.served_model_name or served_model_name(args.model), context, name)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
