"""Who may use a served model: the endpoint's API key (OpenAI's Bearer scheme, as vLLM's `--api-key` and
`VLLM_API_KEY`), the chat's logins (Gradio's `auth=`), and the warning for a server that binds beyond loopback
without either."""

from __future__ import annotations

import hmac
import ipaddress
from pathlib import Path

from dapo_suite.inference.openai_fields import error_response

API_KEY_ENV = "DAPO_SUITE_API_KEY"  # what `serve api --api-key` defaults to
LOOPBACK_NAMES = ("localhost",)


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host in LOOPBACK_NAMES


def exposure_warning(host: str, port: int, protected: bool, what: str, how: str) -> str | None:
    """A warning for a server on a non-loopback `host` that lets anyone in (not `protected`): what it exposes
    and the flag that closes it; None when it binds loopback or is protected."""
    if protected or is_loopback(host):
        return None
    return (
        f"warning: {what} listens on {host}:{port} with no {how}: anyone who reaches that port can use "
        "the model"
    )


class RequireApiKey:
    """ASGI middleware: a request to /v1/... without `Authorization: Bearer <key>` gets 401 in OpenAI's error
    shape before the app reads its body; /health stays open, as vLLM's does."""

    def __init__(self, app, api_key: str) -> None:
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1") or scope["method"] == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"authorization")
        if given is not None and hmac.compare_digest(given, self.expected):
            await self.app(scope, receive, send)
            return
        message = (
            "Incorrect API key provided."
            if given
            else "You didn't provide an API key. Provide it in an "
            "Authorization header using Bearer auth (Authorization: Bearer YOUR_KEY)."
        )
        await error_response(401, message, None, "invalid_api_key")(scope, receive, send)


def read_logins(auth: str | None, auth_file: str | None) -> list[tuple[str, str]]:
    """The chat's (user, password) pairs: `--auth user:password`, then each `user:password` line of
    `--auth-file` (blank lines and # comments skipped); a malformed one is a ValueError naming the flag or the
    file's line."""

    def pair(text: str, where: str) -> tuple[str, str]:
        user, colon, password = text.partition(":")
        if not (colon and user.strip() and password):
            raise ValueError(f"{where}: expected user:password (a user name, a colon, a password)")
        return user.strip(), password

    logins = [pair(auth, "--auth")] if auth is not None else []
    if auth_file is not None:
        path = Path(auth_file).expanduser()
        if not path.is_file():
            raise ValueError(f"--auth-file {auth_file}: no such file")
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip() and not line.lstrip().startswith("#"):
                logins.append(pair(line, f"--auth-file {auth_file} line {number}"))
        if len(logins) == (auth is not None):
            raise ValueError(f"--auth-file {auth_file}: no user:password line")
    return logins
