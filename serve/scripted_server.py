"""A scripted OpenAI-compatible server for fault injection and latency benchmarks, never a stand-in for a model
(the end-to-end tests run against `transformers serve`). GET /v1/models lists one model, `scripted`;
POST /v1/chat/completions follows a script of behaviours, one per request in arrival order, then `default`:

  ok           200 with `reply` as the assistant message after `latency_s`
  400/429/5xx  that status with an OpenAI-style error body (any three-digit code)
  timeout      sleeps `hang_s` (longer than the client's timeout) before answering
  malformed    200 with a body that is not JSON
  drop         closes the connection without a response

    with ScriptedServer(script=["429", "503"], latency_s=0.1) as server:
        ... server.base_url, server.requests (bodies received), server.stats (requests, completed, max_in_flight)

Used by the data pipeline's and the evaluator's retry tests and by benchmarks/data_build.py and
benchmarks/eval_throughput.py (`scripted_server_process`, its own process so it shares no GIL with the client).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "scripted"


class ScriptedServer:
    def __init__(self, script: list[str] | None = None, default: str = "ok", reply: str = "Answer: 42",
                 latency_s: float = 0.0, hang_s: float = 5.0):
        self.script, self.default, self.reply = list(script or []), default, reply
        self.latency_s, self.hang_s = latency_s, hang_s
        self.requests: list[dict[str, Any]] = []
        self.stats = {"requests": 0, "completed": 0, "in_flight": 0, "max_in_flight": 0}
        self._lock = threading.Lock()
        ThreadingHTTPServer.request_queue_size = 4096  # the default backlog of 5 drops bursts of connections
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _begin(self, body: dict[str, Any]) -> str:
        with self._lock:
            self.requests.append(body)
            self.stats["requests"] += 1
            self.stats["in_flight"] += 1
            self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self.stats["in_flight"])
            return self.script.pop(0) if self.script else self.default

    def _end(self, completed: bool) -> None:
        with self._lock:
            self.stats["in_flight"] -= 1
            self.stats["completed"] += completed

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body go out as two writes: no 40 ms delayed-ACK stall

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _send(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode())
                else:
                    self._send(404, b'{"error": {"message": "not found"}}')

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                action = server._begin(body)
                completed = False
                try:
                    completed = self._act(action, body)
                finally:
                    server._end(completed)

            def _act(self, action: str, body: dict[str, Any]) -> bool:
                if action == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return False
                if action.isdigit():
                    time.sleep(server.latency_s)
                    error = {"error": {"message": f"scripted {action}", "type": "scripted", "code": action}}
                    self._send(int(action), json.dumps(error).encode())
                    return False
                if action == "timeout":
                    time.sleep(server.hang_s)
                if action == "malformed":
                    self._send(200, b"{this is not json")
                    return False
                time.sleep(server.latency_s)
                completion = {
                    "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", MODEL),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": server.reply}}],
                    "usage": {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14},
                }
                self._send(200, json.dumps(completion).encode())
                return True

        return Handler


@contextmanager
def scripted_server_process(latency_s: float = 0.0, reply: str = "Answer: 42") -> Iterator[str]:
    """A ScriptedServer in a child process (no GIL shared with the client being measured); yields its base URL."""
    child = subprocess.Popen([sys.executable, "-m", "serve.scripted_server", "--latency", str(latency_s),
                              "--reply", reply], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        url = child.stdout.readline().strip()
        if not url:
            raise RuntimeError("the scripted server process did not start")
        yield url
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    """`python -m serve.scripted_server --latency 0.2`: print the base URL, serve until stdin closes."""
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
