"""The chat with the Python tool, driven with gradio_client as a browser would: against the sampler's endpoint
on the embedded model, a code block stops the model's turn, runs in the sandbox, shows folded with its output,
and the reply continues from the output (the endpoint's `continue_final_message`)."""

from __future__ import annotations

import pytest
from test_serve_app import running_app

from dapo_suite.core.ports import free_port
from dapo_suite.core.sandbox import isolation
from dapo_suite.inference.endpoint import start_endpoint
from serve.config import ServeConfig

pytest.importorskip("gradio_client")

QUESTION = "Use Python to compute 2**20."  # greedy SmolLM2-135M writes a block, then invents "Output: 255"


@pytest.fixture(scope="module")
def app():
    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    with start_endpoint(None, startup_timeout_s=300, dtype="float32") as endpoint:
        config = ServeConfig(port=free_port(), max_tokens=96, request_timeout_s=120, tools="python")
        with running_app(config, endpoint) as (url, client):
            yield client


def test_a_code_block_runs_in_the_sandbox_and_shows_folded_with_its_output(app):
    job = app.submit(QUESTION, 0.0, 0.7, 96, False, api_name="/chat")
    list(job)
    final = job.outputs()[-1]
    thinking, calls = (
        final[0],
        [m for m in final if (m.get("metadata") or {}).get("title", "").startswith("Ran Python")],
    )
    assert len(calls) >= 1, final
    assert "print(2**20)" in calls[0]["content"] and "1048576" in calls[0]["content"]
    assert calls[0]["metadata"]["title"] == "Ran Python" and calls[0]["metadata"]["status"] == "done"
    assert "```output\n1048576\n```" in thinking["content"]  # the real output, where the model invented one
    assert "Output: 255" not in thinking["content"]


def test_continuing_an_assistant_message_needs_it_last():
    """The endpoint's side of it: `continue_final_message` continues the assistant's message, and says what is
    wrong otherwise."""
    from dapo_suite.inference.openai_fields import RequestFieldError, continuation

    assert continuation(
        {"continue_final_message": True, "add_generation_prompt": False},
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
    )
    with pytest.raises(RequestFieldError, match="must be the assistant's"):
        continuation({"continue_final_message": True}, [{"role": "user", "content": "q"}])
    with pytest.raises(RequestFieldError, match="needs add_generation_prompt false"):
        continuation(
            {"continue_final_message": True, "add_generation_prompt": True},
            [{"role": "assistant", "content": "a"}],
        )
