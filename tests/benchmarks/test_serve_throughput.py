"""benchmarks/serve_throughput.py accounts for every request: against a server that answers in turn a full
stream, an error status, a stream that closes before its end, and nothing at all, each failure is counted by
its kind, the failed requests' tokens stay out of the tokens/s, and completed + cut + failed is every request
sent."""

from __future__ import annotations

import asyncio
import itertools
import json

import pytest

from benchmarks import serve_throughput
from benchmarks.serve_throughput import cores_text, measure, parse_cores

PIECES = 3  # content pieces (and completion tokens) of a full answer


def sse(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


def piece(text: str) -> bytes:
    return sse({"choices": [{"delta": {"content": text}}]})


async def fake_server() -> tuple[asyncio.AbstractServer, int]:
    """A server whose requests go in turn: a full answer, HTTP 500, a stream cut after 2 pieces, silence."""
    turns = itertools.cycle(("full", "error", "cut", "silent"))

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        turn = next(turns)
        stream = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        if turn == "error":
            writer.write(
                b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\nboom"
            )
        elif turn == "full":
            writer.write(
                stream
                + b"".join(piece(str(i)) for i in range(PIECES))
                + sse({"choices": [], "usage": {"completion_tokens": PIECES}})
                + sse("[DONE]")
            )
        elif turn == "cut":
            writer.write(stream + piece("a") + piece("b"))
        else:
            writer.write(stream)
            await writer.drain()
            await asyncio.sleep(30)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


def test_every_request_is_counted_and_failed_ones_add_no_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(serve_throughput, "FAILED_PAUSE_S", 0.01)

    async def run() -> dict:
        server, port = await fake_server()
        async with server:
            return await measure(
                f"http://127.0.0.1:{port}/v1", clients=1, max_tokens=8, duration_s=2.0, request_timeout_s=0.3
            )

    window = asyncio.run(run())
    assert window["completed"] >= 2 and {"http", "disconnect", "timeout"} <= set(window["failures"])
    assert window["failed_requests"] == sum(window["failures"].values())
    assert window["requests"] == window["completed"] + window["cut_by_window_end"] + window["failed_requests"]
    assert window["failed_tokens_not_counted"] == 2 * window["failures"]["disconnect"]
    assert (
        window["tokens"] == PIECES * window["completed"]
    )  # the window ends in a full answer or on a silent one
    assert window["tokens_per_s"] == pytest.approx(window["tokens"] / window["window_s"])


def test_cpu_lists() -> None:
    assert parse_cores("0") == {0} and parse_cores("0-1") == {0, 1} and parse_cores("0,2-3") == {0, 2, 3}
    assert (
        cores_text({0, 2, 3}) == "0,2-3" and cores_text({1}) == "1" and cores_text(None) == "all (unpinned)"
    )
    with pytest.raises(ValueError):
        parse_cores("a")
