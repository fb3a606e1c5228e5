"""A scripted OpenAI-compatible server for fault injection and latency benchmarks, never a stand-in for a
model (the end-to-end tests run against `transformers serve`). GET /v1/models lists one model, `scripted`;
POST /v1/chat/completions follows a script of behaviours, one per request in arrival order, then `default`:

  ok           200 with `reply` as the assistant message after `latency_s` (`reply` may be a function of the
               request body: a rewriter's answer per problem, for tampering tests)
  400/429/5xx  that status with an OpenAI-style error body (any three-digit code)
  timeout      sleeps `hang_s` (longer than the client's timeout) before answering
  malformed    200 with a body that is not JSON
  drop         closes the connection without a response

    with ScriptedServer(script=["429", "503"], latency_s=0.1) as server:
        ... server.base_url, server.requests (bodies received), server.stats (requests, completed,
        max_in_flight)

A test double shared by the data pipeline's and the evaluator's retry tests and by benchmarks/data_build.py
and benchmarks/eval_throughput.py (`scripted_server_process`, its own process so it shares no GIL with the
client), so it lives in the package (`dapo_suite.testing`), which both may import; nothing in the product
imports it.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http import HTTPStatus
from typing import Any

MODEL = "scripted"


class ScriptedServer:
    """An asyncio HTTP/1.1 server (keep-alive, Content-Length bodies) on a thread of its own: waiting costs no
    thread per request, so the server spends far less CPU than the client it measures."""

    def __init__(
        self,
        script: list[str] | None = None,
        default: str = "ok",
        reply: str | Callable[[dict[str, Any]], str] = "Answer: 42",
        latency_s: float = 0.0,
        hang_s: float = 5.0,
    ):
        self.script, self.default, self.reply = list(script or []), default, reply
        self.latency_s, self.hang_s = latency_s, hang_s
        self.requests: list[dict[str, Any]] = []
        self.stats = {"requests": 0, "completed": 0, "in_flight": 0, "max_in_flight": 0}
        self._loop = asyncio.new_event_loop()
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._serve_connection, "127.0.0.1", 0, backlog=4096)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        async def close() -> None:
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    async def _serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                request_line, *header_lines = head.decode("latin-1").split("\r\n")
                headers = {
                    k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines if h)
                }
                body = await reader.readexactly(int(headers.get("content-length", 0)))
                method, path = request_line.split(" ")[:2]
                if method == "GET":
                    found = path.rstrip("/").endswith("/models")
                    payload = (
                        {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                        if found
                        else {"error": {"message": "not found"}}
                    )
                    await self._send(writer, 200 if found else 404, json.dumps(payload).encode())
                elif not await self._answer(writer, json.loads(body or b"{}")):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, body: dict[str, Any]) -> bool:
        """Act out the next scripted behaviour; False when the connection is to be dropped."""
        self.requests.append(body)
        stats = self.stats
        stats["requests"] += 1
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        action = self.script.pop(0) if self.script else self.default
        try:
            if action == "drop":
                return False
            if action == "timeout":
                await asyncio.sleep(self.hang_s)
            await asyncio.sleep(self.latency_s)
            if action.isdigit():
                error = {"error": {"message": f"scripted {action}", "type": "scripted", "code": action}}
                await self._send(writer, int(action), json.dumps(error).encode())
            elif action == "malformed":
                await self._send(writer, 200, b"{this is not json")
            else:
                completion = {
                    "id": "chatcmpl-scripted",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", MODEL),
                    "choices": [
                        {
                            "index": 0,
                            "finish_reason": "stop",
                            "message": {
                                "role": "assistant",
                                "content": self.reply(body) if callable(self.reply) else self.reply,
                            },
                        }
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
                }
                await self._send(writer, 200, json.dumps(completion).encode())
                stats["completed"] += 1
            return True
        finally:
            stats["in_flight"] -= 1

    @staticmethod
    async def _send(writer: asyncio.StreamWriter, status: int, payload: bytes) -> None:
        writer.write(
            f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()


@contextmanager
def scripted_server_process(latency_s: float = 0.0, reply: str = "Answer: 42") -> Iterator[str]:
    """A ScriptedServer in a child process (no GIL shared with the client being measured); yields its base
    URL."""
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dapo_suite.testing.scripted_server",
            "--latency",
            str(latency_s),
            "--reply",
            reply,
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = child.stdout.readline().strip()
        if not url:
            raise RuntimeError("the scripted server process did not start")
        yield url
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    """`python -m dapo_suite.testing.scripted_server --latency 0.2`: print the base URL, serve until stdin
    closes."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency", type=float, default=0.0)
    parser.add_argument("--reply", default="Answer: 42")
    args = parser.parse_args()
    with ScriptedServer(latency_s=args.latency, reply=args.reply) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()
