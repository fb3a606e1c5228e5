"""A scripted OpenAI-compatible server for fault injection and latency benchmarks only (never as a stand-in for
a model: the end-to-end path runs against `transformers serve`). It answers POST /v1/chat/completions following a
script of behaviours, one per request in arrival order, then `default`:

  ok        200 with `reply` (a rewrite JSON) after `latency_s`
  429 / 500 that status with an OpenAI-style error body
  timeout   sleeps `hang_s` (longer than the client's timeout) before answering
  malformed 200 with a body that is not JSON
  drop      closes the connection without a response
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedServer:
    def __init__(self, script: list[str] | None = None, default: str = "ok", reply: str | None = None,
                 latency_s: float = 0.0, hang_s: float = 5.0):
        self.script, self.default, self.latency_s, self.hang_s = list(script or []), default, latency_s, hang_s
        self.reply = reply or json.dumps({"problem": "p", "answer": 3, "form": "m/n", "params": {"m": 1, "n": 2},
                                          "target": "m+n"})
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        ThreadingHTTPServer.request_queue_size = 256  # the default backlog of 5 drops bursts of connections
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

    def _next(self, body: dict[str, Any]) -> str:
        with self._lock:
            self.requests.append(body)
            return self.script.pop(0) if self.script else self.default

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

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                action = server._next(body)
                if action == "drop":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if action in ("429", "500", "503"):
                    error = {"error": {"message": f"scripted {action}", "type": "scripted", "code": action}}
                    self._send(int(action), json.dumps(error).encode())
                    return
                if action == "timeout":
                    time.sleep(server.hang_s)
                if action == "malformed":
                    self._send(200, b"{this is not json")
                    return
                time.sleep(server.latency_s)
                completion = {
                    "id": "chatcmpl-scripted", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", "scripted"),
                    "choices": [{"index": 0, "finish_reason": "stop",
                                 "message": {"role": "assistant", "content": server.reply}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                }
                self._send(200, json.dumps(completion).encode())

        return Handler


def main() -> None:
    """`python -m data_pipeline.scripted_server --latency 0.2`: serve in its own process (no GIL shared with the
    client being measured) and print the base URL on the first line."""
    import argparse
    import sys

    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=0.0)
    args = parser.parse_args()
    with ScriptedServer(latency_s=args.latency) as server:
        print(server.base_url, flush=True)
        sys.stdin.read()  # serve until the parent closes our stdin


if __name__ == "__main__":
    main()
