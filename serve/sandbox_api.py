"""`dapo-suite sandbox serve`: SandboxFusion's `POST /run_code` on dapo-suite's sandbox, so the
`sandbox-fusion` client and verl tool configs written for SandboxFusion work unchanged.

Request (SandboxFusion's `RunCodeRequest`): `code`, `language` ("python"), `run_timeout` (seconds, capped at
the sandbox's wall-time limit), `stdin`; `compile_timeout`, `files` and `fetch_files` are accepted empty only
(no compiled languages, no files in or out: a non-empty one gets 400). Response (`RunCodeResponse`): `status`
Success | Failed | SandboxError, `message`, `run_result` {status Finished | TimeLimitExceeded, execution_time,
return_code, stdout, stderr}, `files` {}. At most `max_concurrency` calls run at once; the rest wait their
turn. A request that is not such an object gets 400 naming the field; with `api_key`, one without
`Authorization: Bearer KEY` gets 401.
"""

from __future__ import annotations

import asyncio
import hmac

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from dapo_suite.core.sandbox import OUTCOMES, RunResult, Sandbox

LANGUAGES = ("python", "python3")
FIELDS = {
    "code": str,
    "language": str,
    "run_timeout": (int, float),
    "compile_timeout": (int, float),
    "stdin": (str, type(None)),
    "files": dict,
    "fetch_files": list,
    "memory_limit_MB": (int, float),
}


class BadRequest(ValueError):
    """A request the server refuses: its message names the field."""


def parse_run_code(body: object) -> dict:
    """The request's fields, checked; BadRequest names what is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object with `code` and `language`")
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; run_code takes {', '.join(FIELDS)}")
    for name in ("code", "language"):
        if name not in body:
            raise BadRequest(f"field `{name}` is required")
    for name, kind in FIELDS.items():
        if name in body and (not isinstance(body[name], kind) or isinstance(body[name], bool)):
            raise BadRequest(f"field `{name}` has the wrong type ({type(body[name]).__name__})")
    if body["language"] not in LANGUAGES:
        raise BadRequest(f"language {body['language']!r} is not supported: this sandbox runs python only")
    if body.get("files") or body.get("fetch_files"):
        raise BadRequest("`files` and `fetch_files` are not supported: the sandbox has no files in or out")
    if "run_timeout" in body and not body["run_timeout"] > 0:
        raise BadRequest("field `run_timeout` must be > 0")
    return body


def fusion_response(result: RunResult) -> dict:
    """A RunResult in SandboxFusion's RunCodeResponse shape."""
    if result.outcome == "sandbox_error":
        return {
            "status": "SandboxError",
            "message": result.message,
            "compile_result": None,
            "run_result": None,
            "files": {},
        }
    return {
        "status": "Success" if result.return_code == 0 else "Failed",
        "message": result.message,
        "compile_result": None,
        "run_result": {
            "status": OUTCOMES[result.outcome],
            "execution_time": result.execution_time,
            "return_code": result.return_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
        },
        "files": {},
    }


def make_app(sandbox: Sandbox, max_concurrency: int = 2, api_key: str | None = None) -> FastAPI:
    app = FastAPI(title="dapo-suite sandbox", docs_url=None, redoc_url=None)
    slots = asyncio.Semaphore(max(max_concurrency, 1))
    expected = f"Bearer {api_key}".encode() if api_key else None

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.post("/run_code")
    async def run_code(request: Request) -> JSONResponse:
        if expected is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return JSONResponse(
                    {"detail": "missing or wrong API key: send Authorization: Bearer KEY"}, 401
                )
        try:
            body = parse_run_code(await request.json())
        except ValueError as error:  # BadRequest, or a body that is not JSON
            return JSONResponse(
                {"detail": str(error) if isinstance(error, BadRequest) else "the body is not JSON"}, 400
            )
        async with slots:
            result = await asyncio.to_thread(
                sandbox.run, body["code"], body.get("stdin"), body.get("run_timeout")
            )
        return JSONResponse(fusion_response(result))

    return app
