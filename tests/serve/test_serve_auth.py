"""Who gets in (issue 62): `dapo-suite serve api --api-key K` through the real `openai` SDK (401 in OpenAI's
shape without the key, a completion with it), the chat's login page in a real browser
(tests/serve/test_serve_browser.py's chromium), and the warning for a server that binds beyond loopback with
neither."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import httpx
import openai
import pytest
from test_serve_browser import CHROMIUM, CHROMIUM_ARGS, QUESTION, chat_app
from toy import serve_api

from dapo_suite.core.ports import free_port
from serve.app import launch_kwargs
from serve.auth import API_KEY_ENV, is_loopback
from serve.config import ServeConfig

KEY = "sk-test-62"


def _env(extra: dict | None = None) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", **(extra or {})}


def _cli(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dapo_suite.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(env),
    )


@pytest.fixture(scope="module")
def keyed_api():
    """(base URL, model name) of `serve api --api-key KEY` on the embedded model."""
    with serve_api("--dtype", "float32", "--api-key", KEY, env=_env()) as served:
        yield served.base_url, served.model


def test_the_openai_sdk_without_the_key_is_refused_and_with_it_gets_a_completion(keyed_api):
    base_url, model = keyed_api
    request = dict(
        model=model, messages=[{"role": "user", "content": "What is 2 + 2?"}], max_tokens=8, temperature=0
    )
    wrong = openai.OpenAI(base_url=base_url, api_key="sk-wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.chat.completions.create(**request)
    assert refused.value.status_code == 401
    assert refused.value.body == {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    right = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
    reply = right.chat.completions.create(**request)
    assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
    assert [entry.id for entry in right.models.list()] == [model]


def test_a_request_without_a_key_gets_401_before_its_body_is_read_and_health_stays_open(keyed_api):
    base_url, _ = keyed_api
    # not JSON: a request that got as far as the parser would be answered 400
    answer = httpx.post(f"{base_url}/chat/completions", content=b"{not json", timeout=30)
    assert answer.status_code == 401
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and "Authorization: Bearer" in error["message"]
    assert httpx.get(base_url.removesuffix("/v1") + "/health", timeout=30).status_code == 200


def test_the_api_key_is_read_from_the_environment(monkeypatch):
    from serve.cli import api

    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert api.make_context("api", []).params["api_key"] == "from-env"
    assert api.make_context("api", ["--api-key", "flag"]).params["api_key"] == "flag"


@pytest.mark.parametrize(
    ("args", "warned"),
    [
        (["serve", "api", "--host", "0.0.0.0"], "serve api listens on 0.0.0.0:"),
        (["serve", "api", "--host", "0.0.0.0", "--api-key", KEY], None),
        (["serve", "api", "--host", "127.0.0.1"], None),
        (["serve", "--host", "0.0.0.0"], "the chat listens on 0.0.0.0:"),
        (["serve", "--host", "0.0.0.0", "--auth", "ann:pw"], None),
    ],
)
def test_binding_beyond_loopback_with_no_key_or_login_warns(args, warned):
    # a missing model stops the command right after the warning, before anything binds
    cli = _cli(*args, "--model", "/no/such/model", env={API_KEY_ENV: ""})
    output, _ = cli.communicate(timeout=120)
    assert cli.returncode == 1 and "--model /no/such/model: no such directory" in output, output
    if warned:
        assert warned in output and "anyone who reaches that port can use the model" in output
    else:
        assert "warning:" not in output


def test_loopback_is_this_machine_only():
    assert all(map(is_loopback, ["127.0.0.1", "127.0.1.1", "::1", "[::1]", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "192.168.1.20", "gpu-box"]))


def test_a_malformed_login_is_refused_naming_its_flag_or_line(tmp_path):
    logins = tmp_path / "logins.txt"
    logins.write_text("# the team\nann:pw1\n\nbob\n")
    for config, message in (
        ({"auth": "ann"}, "--auth: expected user:password"),
        ({"auth_file": str(logins)}, f"--auth-file {logins} line 4: expected user:password"),
        ({"auth_file": str(tmp_path / "none")}, "no such file"),
    ):
        with pytest.raises(ValueError, match=re.escape(message)):
            ServeConfig(**config)
    logins.write_text("# the team\nann:pw1\n\nbob:pw:2\n")
    assert launch_kwargs(ServeConfig(auth="cy:pw3", auth_file=str(logins)))["auth"] == [
        ("cy", "pw3"),
        ("ann", "pw1"),
        ("bob", "pw:2"),
    ]


@pytest.fixture(scope="module")
def login_app_url(tmp_path_factory):
    logins = tmp_path_factory.mktemp("auth") / "logins.txt"
    logins.write_text("ann:correct horse\n")
    with chat_app(
        ServeConfig(port=free_port(), temperature=0.0, max_tokens=64, auth_file=str(logins))
    ) as url:
        yield url


def test_the_chat_opens_only_after_its_login_in_a_browser(login_app_url):
    from playwright.sync_api import expect, sync_playwright

    assert (
        httpx.get(login_app_url + "config", timeout=30).status_code == 401
    )  # the app's config needs a login
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            page.goto(login_app_url, wait_until="load")
            expect(page.get_by_text("Log in to chat with the model.")).to_be_visible(timeout=30_000)
            expect(page.get_by_text("DAPO reasoner chat")).to_have_count(0)
            page.get_by_label("username").fill("ann")
            page.get_by_label("password").fill("wrong")
            page.get_by_role("button", name="Login").click()
            expect(page.get_by_text("Incorrect Credentials")).to_be_visible(timeout=30_000)
            expect(page.get_by_text("DAPO reasoner chat")).to_have_count(0)

            page.get_by_label("username").fill("ann")  # a refused login clears the form
            page.get_by_label("password").fill("correct horse")
            page.get_by_role("button", name="Login").click()
            expect(page.get_by_text("DAPO reasoner chat")).to_be_visible(timeout=30_000)
            question = page.locator("#question textarea")
            question.fill(QUESTION)
            question.press("Enter")
            expect(page.locator("#chat .badge-integer")).to_contain_text("integer 12", timeout=120_000)
        finally:
            browser.close()
