"""A free TCP port, for whatever listens or meets on one: a model server (`inference.endpoint`, `serve`), the
rendezvous of vLLM's one-process group (`inference.engines`) and of torch.distributed or Ray in the tests."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port on `host` that nothing listens on now (the OS picks it; another process may take it before
    use)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
