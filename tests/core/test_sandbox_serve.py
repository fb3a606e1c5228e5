"""`dapo-suite sandbox serve` against SandboxFusion's own client (`sandbox-fusion` on PyPI): `run_code` round
trips, limits reported in its statuses, bad requests answered 400, the API key, and the bound on concurrency.
The server is the real command on 127.0.0.1."""

from __future__ import annotations

import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from dapo_suite.core.ports import free_port
from dapo_suite.core.sandbox import isolation

pytest.importorskip("sandbox_fusion")


def start(*flags: str) -> tuple[subprocess.Popen, str]:
    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    port = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dapo_suite.cli",
            "sandbox",
            "serve",
            "--port",
            str(port),
            "--wall-seconds",
            "2",
            *flags,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise AssertionError(f"sandbox serve did not start: {process.stdout.read().decode()}")


@pytest.fixture(scope="module")
def server():
    process, url = start("--max-concurrency", "2")
    yield url
    process.terminate()
    process.wait(10)


def test_the_sandbox_fusion_client_runs_code(server):
    from sandbox_fusion import RunCodeRequest, RunStatus, run_code

    response = run_code(
        RunCodeRequest(code="import sympy\nprint(sympy.factorint(360))", language="python"), endpoint=server
    )
    assert response.status == RunStatus.Success
    assert (
        response.run_result.status.value == "Finished"
        and response.run_result.stdout == "{2: 3, 3: 2, 5: 1}\n"
    )
    failed = run_code(RunCodeRequest(code="1/0", language="python"), endpoint=server)
    assert failed.status == RunStatus.Failed and "ZeroDivisionError" in failed.run_result.stderr
    stdin = run_code(
        RunCodeRequest(code="print(input()[::-1])", stdin="abc\n", language="python"), endpoint=server
    )
    assert stdin.run_result.stdout == "cba\n"


def test_a_timeout_is_sandbox_fusion_s_time_limit_status(server):
    from sandbox_fusion import RunCodeRequest, run_code

    response = run_code(
        RunCodeRequest(code="import time\ntime.sleep(30)", language="python", run_timeout=1), endpoint=server
    )
    assert response.run_result.status.value == "TimeLimitExceeded" and response.run_result.execution_time < 2


@pytest.mark.parametrize(
    "body, field",
    [
        ({"language": "python"}, "`code` is required"),
        ({"code": "print(1)", "language": "cpp"}, "python only"),
        ({"code": 3, "language": "python"}, "`code` has the wrong type"),
        ({"code": "print(1)", "language": "python", "files": {"a.txt": "eA=="}}, "`files`"),
        ({"code": "print(1)", "language": "python", "network": True}, "unknown field(s) network"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_requests_get_400_naming_the_field(server, body, field):
    response = httpx.post(f"{server}/run_code", json=body)
    assert response.status_code == 400 and field in response.json()["detail"]


def test_concurrency_is_bounded(server):
    start_time = time.monotonic()
    with ThreadPoolExecutor(4) as pool:
        replies = list(
            pool.map(
                lambda _: httpx.post(
                    f"{server}/run_code",
                    timeout=30,
                    json={"code": "import time\ntime.sleep(1)\nprint('ok')", "language": "python"},
                ).json(),
                range(4),
            )
        )
    assert [r["run_result"]["stdout"] for r in replies] == ["ok\n"] * 4
    assert time.monotonic() - start_time >= 2.0  # two at a time: four one-second calls take two rounds


def test_an_api_key_is_required_when_set():
    process, url = start("--api-key", "s3cret", "--max-concurrency", "1")
    try:
        body = {"code": "print(1)", "language": "python"}
        assert httpx.post(f"{url}/run_code", json=body).status_code == 401
        ok = httpx.post(f"{url}/run_code", json=body, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200 and ok.json()["run_result"]["stdout"] == "1\n"
    finally:
        process.terminate()
        process.wait(10)
