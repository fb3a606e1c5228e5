"""The chat in a real browser (Debian's chromium driven by Playwright, headless): type a question, watch
tokens stream into "Thinking", see the answer badge and the served model's name, and save the page as
docs/screenshots/serve.png, the README's picture, so that the picture is always today's app (commit it when it
changes)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dapo_suite.core.ports import free_port
from dapo_suite.inference.endpoint import start_endpoint
from dapo_suite.inference.models import EMBEDDED_NAME, embedded_model_path
from serve.app import build_app, launch_kwargs
from serve.config import ServeConfig

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "serve.png"
QUESTION = "What is 7 + 5?"  # greedy SmolLM2-135M with the DAPO prompt ends "... Answer: 12" in ~40 tokens
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextmanager
def chat_app(config: ServeConfig) -> Iterator[str]:
    """The chat app on the embedded model at `config`, for a browser: its URL (skips without Chromium or
    playwright)."""
    if not CHROMIUM.is_file():
        pytest.skip(f"{CHROMIUM} is missing: `apt-get install -y chromium` to run the browser test")
    pytest.importorskip("playwright.sync_api")
    with start_endpoint(None, startup_timeout_s=300, dtype="float32") as endpoint:
        demo = build_app(config, endpoint)
        demo.queue(default_concurrency_limit=config.concurrency_limit, max_size=config.max_queue)
        for attempt in range(3):
            try:
                demo.launch(prevent_thread_lock=True, quiet=True, **launch_kwargs(config))
                break
            except OSError:  # the port went to another process while the model server started: take a new one
                if attempt == 2:
                    raise
                config = dataclasses.replace(config, port=free_port())
        try:
            yield f"http://127.0.0.1:{config.port}/"
        finally:
            demo.close()


@pytest.fixture(scope="module")
def app_url():
    # Greedy decoding makes the reply (and so the screenshot) the same on every run.
    with chat_app(ServeConfig(port=free_port(), temperature=0.0, max_tokens=64)) as url:
        yield url


def test_browser_chat_streams_and_shows_the_answer_badge(app_url, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    screenshot = tmp_path / "serve.png"  # copied over the README's picture once the whole check has passed
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900}, device_scale_factor=1)
            page.goto(app_url, wait_until="load")
            expect(page.get_by_text("DAPO reasoner chat")).to_be_visible()
            # the model by its name, never by a path on the server's disk
            expect(page.get_by_text(EMBEDDED_NAME).first).to_be_visible()
            assert str(embedded_model_path()) not in page.inner_text("body")
            question = page.locator("#question textarea")
            question.fill(QUESTION)
            question.press("Enter")

            # Streaming: the Thinking message appears while the reply is still growing.
            thinking = page.get_by_text("Thinking", exact=False).first
            expect(thinking).to_be_visible(timeout=60_000)
            bot = page.locator("#chat .bot")
            lengths = []
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and page.locator("#chat .badge-integer").count() == 0:
                lengths.append(len(bot.all_inner_texts() and "".join(bot.all_inner_texts())))
                time.sleep(0.25)
            assert len(set(lengths)) >= 3, f"the reply should grow token by token, saw lengths {lengths}"

            badge = page.locator("#chat .badge-integer")
            expect(badge).to_be_visible(timeout=60_000)
            expect(badge).to_contain_text("integer 12")
            expect(page.locator("#chat .reply-stats")).to_contain_text("tokens/s", timeout=30_000)
            expect(question).to_be_editable(timeout=30_000)  # the reply is over: the input is handed back

            # Collapsible: Gradio folds a finished Thinking message; a click opens it again.
            page.locator("#chat .thought-group .title").first.click()
            expect(page.locator("#chat .thought-group .message-content").first).to_contain_text(
                "5", timeout=10_000
            )
            time.sleep(0.5)  # let the unfold animation finish before the screenshot
            page.screenshot(path=str(screenshot), full_page=False)
        finally:
            browser.close()
    assert screenshot.stat().st_size > 10_000
    SCREENSHOT.write_bytes(screenshot.read_bytes())
