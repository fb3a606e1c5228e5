"""`dapo-suite serve api` on a fresh machine (empty HOME and HF_HOME) with the embedded model behind each CPU
engine (dapo-suite's batched sampler, the default; `transformers serve`, in the slow suite): /v1/models
through the `openai` client, 400 at once for an oversized prompt or a bad max_tokens, a small request answered
right after an oversized one, a disconnected client's generation stopped, sampling as OpenAI's, and (the
sampler) concurrent requests decoded together."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import httpx
import openai
import pytest
from toy import serve_api

from dapo_suite.inference.fused_step import kernels
from dapo_suite.inference.models import cache_dir, embedded_model_path


@pytest.fixture(scope="module", params=["sampler", pytest.param("transformers", marks=pytest.mark.slow)])
def api(request, tmp_path_factory):
    """(base URL, model name, pid of the `serve api` process) on a machine whose HOME and HF_HOME are
    empty."""
    home = tmp_path_factory.mktemp("home")
    embedded_model_path()  # converted once into the shared cache, which the fresh HOME does not hold
    env = {
        **os.environ,
        "HOME": str(home),
        "HF_HOME": str(home / "hf"),
        "DAPO_SUITE_CACHE": str(cache_dir()),
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("XDG_CACHE_HOME", None)
    # the fresh HOME is about the model caches; the sampler's kernels, built once in this process, are reused
    # (a build in the empty HOME would cost a compile of ~1 minute per engine)
    if (fused := kernels()) is not None:
        env["TORCH_EXTENSIONS_DIR"] = str(Path(fused.__file__).parent.parent)
    # float32: greedy replies (a counting reply long enough to outlast a client, the stop-string reply) are
    # the same on every CPU; bf16 (auto on AVX-512 BF16) writes other text
    with serve_api("--engine", request.param, "--dtype", "float32", env=env) as served:
        yield served.base_url, served.model, served.process.pid


def _client(base_url: str, timeout: float = 120) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=timeout)


def test_models_are_listed_with_an_empty_hugging_face_cache(api):
    base_url, model, _ = api
    assert [m.id for m in _client(base_url).models.list()] == [model] == ["SmolLM2-135M-Instruct"]


def test_requests_may_name_the_model_by_its_listed_name_or_its_path(api):
    base_url, model, _ = api
    for name in (model, str(embedded_model_path())):
        reply = _client(base_url).chat.completions.create(
            model=name, max_tokens=2, temperature=0, messages=[{"role": "user", "content": "Hi"}]
        )
        assert reply.choices[0].message.content and reply.model in (model, name)


BAD_CHATS = [  # (request fields, the param OpenAI names)
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "wizard", "content": "Hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 42}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
        "messages[0].content[0]",
    ),
    ({"messages": [{"role": "user", "content": "Hi", "tool_calls": []}]}, "messages[0].tool_calls"),
    ({"extra_body": {"frobnicate": True}}, "frobnicate"),
    ({"tools": [{"type": "function", "function": {"name": "add two"}}]}, "tools[0].function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "reply"}}}, "response_format"),
    (
        {
            "response_format": {"type": "json_object"},
            "tools": [{"type": "function", "function": {"name": "f"}}],
        },
        "response_format",
    ),
    ({"presence_penalty": 0.5}, "presence_penalty"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
]


@pytest.mark.parametrize(("fields", "param"), BAD_CHATS, ids=[param for _, param in BAD_CHATS])
def test_a_request_openai_refuses_gets_400_naming_the_field_through_the_openai_client(api, fields, param):
    base_url, model, _ = api
    request = {"model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}], **fields}
    with pytest.raises(openai.BadRequestError) as caught:
        _client(base_url, timeout=30).chat.completions.create(**request)
    assert caught.value.status_code == 400 and caught.value.body["param"] == param


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logprobs": 6}, "logprobs"),
        ({"prompt": ""}, "prompt"),
        ({"prompt": [[1, 2], [10**7]]}, "prompt"),
        ({"echo": "yes"}, "echo"),
    ],
)
def test_a_completion_openai_refuses_gets_400_naming_the_field(api, fields, param):
    base_url, model, _ = api
    with pytest.raises(openai.BadRequestError) as caught:
        _client(base_url, timeout=30).completions.create(
            **{"model": model, "prompt": "1, 2,", "max_tokens": 2, **fields}
        )
    assert caught.value.body["param"] == param


@pytest.fixture(scope="module")
def reference_model(embedded_model_dir):
    """The embedded model in float32, for the trainer's log-probs of the tokens the server sampled."""
    from dapo_suite.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir), dtype="float32")
    return model.eval(), tokenizer


def _trainer_log_probs(model, prompt: list[int], tokens: list[int], temperature: float):
    """log pi(token | context) as the trainer computes it (`token_log_probs` on the model's logits / T) for
    `tokens` after `prompt`, and the full log-softmax at each of their positions."""
    import torch

    from dapo_suite.train.algorithm import token_log_probs

    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[:, len(prompt) - 1 : -1].float() / temperature
    return token_log_probs(logits, torch.tensor([tokens]))[0], torch.log_softmax(logits[0], dim=-1)


def _token_ids(tokenizer, entries) -> list[int]:
    """The ids of chat log-prob entries, from their bytes (GPT-2's byte-level alphabet: the model's BPE)."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    alphabet = {byte: chr(byte) for byte in printable}
    alphabet |= {
        byte: chr(256 + shift) for shift, byte in enumerate(b for b in range(256) if b not in printable)
    }
    return tokenizer.convert_tokens_to_ids(["".join(alphabet[b] for b in entry.bytes) for entry in entries])


def test_chat_log_probs_are_the_trainers_log_probs_of_the_sampled_tokens(api, request, reference_model):
    """logprobs + top_logprobs, streamed and not: each sampled token's log-prob under softmax(logits / T)
    (before top_p) equals the trainer's for the same tokens within 1e-4 (float32), its alternatives are the
    most likely tokens of that distribution, and a stream gives the same entries as one response. An engine
    that has no log-probs (`transformers serve`) answers 400 naming the field."""
    base_url, model, _ = api
    client = _client(base_url)
    messages = [{"role": "user", "content": "Write a short sentence about the sea."}]
    sampling = {
        "model": model,
        "messages": messages,
        "max_tokens": 12,
        "temperature": 0.7,
        "top_p": 0.9,
        "seed": 4,
        "logprobs": True,
        "top_logprobs": 3,
    }
    if request.node.callspec.params["api"] != "sampler":
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**sampling)
        assert caught.value.body["param"] == "top_logprobs" and "log-probs" in caught.value.body["message"]
        return
    from dapo_suite.core.prompts import render_chat

    reference, tokenizer = reference_model
    reply = client.chat.completions.create(**sampling)
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens and all(
        len(entry.top_logprobs) == 3 for entry in entries
    )
    assert "".join(bytes(entry.bytes).decode(errors="replace") for entry in entries).startswith(
        reply.choices[0].message.content
    )
    prompt = tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"]
    tokens = _token_ids(tokenizer, entries)
    expected, log_softmax = _trainer_log_probs(reference, prompt, tokens, 0.7)
    served = [entry.logprob for entry in entries]
    assert max(abs(a - b) for a, b in zip(served, expected.tolist(), strict=True)) < 1e-4, (served, expected)
    for position, entry in enumerate(entries):
        values, ids = log_softmax[position].topk(3)
        assert _token_ids(tokenizer, entry.top_logprobs) == ids.tolist()
        assert (
            max(
                abs(alt.logprob - value)
                for alt, value in zip(entry.top_logprobs, values.tolist(), strict=True)
            )
            < 1e-4
        )

    streamed = [
        entry
        for chunk in client.chat.completions.create(**sampling, stream=True)
        for choice in chunk.choices
        if choice.logprobs
        for entry in choice.logprobs.content
    ]
    assert [(e.token, round(e.logprob, 4)) for e in streamed] == [
        (e.token, round(e.logprob, 4)) for e in entries
    ]
    greedy = client.chat.completions.create(**{**sampling, "temperature": 0, "top_logprobs": 0})
    assert all(
        entry.top_logprobs == [] and entry.logprob <= 0 for entry in greedy.choices[0].logprobs.content
    )


def test_loglikelihood_requests_as_lm_eval_sends_them_score_the_prompt(api, request, reference_model):
    """lm-evaluation-harness's local-completions scores a continuation with echo + logprobs on
    /v1/completions, prompts as token ids, several in one request: token_logprobs[ctxlen:-1] summed is the
    continuation's log-likelihood, greedy when each token is the top of its top_logprobs. Here against the
    model's own forward."""
    base_url, model, _ = api
    reference, tokenizer = reference_model
    context, continuations = tokenizer("Question: 2 + 2 = ?\nAnswer:")["input_ids"], [" 4", " five"]
    prompts = [context + tokenizer(text)["input_ids"] for text in continuations]
    body = {
        "model": model,
        "prompt": prompts,
        "temperature": 0,
        "max_tokens": 1,
        "logprobs": 1,
        "seed": 1234,
        "echo": True,
    }
    client = _client(base_url)
    if request.node.callspec.params["api"] != "sampler":
        with pytest.raises(openai.BadRequestError) as caught:
            client.completions.create(**body)
        assert caught.value.body["param"] in ("logprobs", "echo")
        return
    for max_tokens in (1, 0):  # lm-eval sends 1 and drops the generated token; 0 scores the prompt alone
        reply = client.completions.create(**{**body, "max_tokens": max_tokens})
        assert [choice.index for choice in reply.choices] == [0, 1]
        for choice, ids in zip(reply.choices, prompts, strict=True):
            logprobs = choice.logprobs
            assert (
                len(logprobs.token_logprobs) == len(ids) + max_tokens and logprobs.token_logprobs[0] is None
            )
            assert choice.text.startswith(tokenizer.decode(ids)) and logprobs.text_offset[0] == 0
            scored = logprobs.token_logprobs[len(context) : len(ids)]
            expected, log_softmax = _trainer_log_probs(reference, context, ids[len(context) :], 1.0)
            assert abs(sum(scored) - expected.sum().item()) < 1e-4
            greedy = all(
                value == max(top.values())
                for value, top in zip(scored, logprobs.top_logprobs[len(context) : len(ids)], strict=True)
            )
            assert greedy == (log_softmax.argmax(-1).tolist() == ids[len(context) :])


def test_an_oversized_prompt_gets_400_at_once_and_a_small_request_is_answered_right_after(api):
    base_url, model, _ = api
    client = _client(base_url)
    started = time.monotonic()
    with pytest.raises(openai.BadRequestError, match=r"the prompt is \d+ tokens; this server takes at most"):
        client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "seven " * 20_000}], max_tokens=16
        )
    assert time.monotonic() - started < 5
    reply = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "What is 2+3?"}], max_tokens=4, temperature=0.0
    )
    assert time.monotonic() - started < 30
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 4


@pytest.mark.parametrize("max_tokens", [0, -5, "abc", 10**6])
def test_a_bad_max_tokens_gets_400(api, max_tokens):
    base_url, model, _ = api
    answer = httpx.post(
        f"{base_url}/chat/completions",
        timeout=10,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens},
    )
    assert answer.status_code == 400 and "max_tokens=" in answer.json()["error"]["message"]


def test_n_choices_come_back_as_indices_in_one_response_and_in_one_stream(api):
    """transformers serve gives one choice per request; the front fans `n` out and renumbers the choices."""
    base_url, model, _ = api
    client = _client(base_url)
    messages = [{"role": "user", "content": "Name a colour."}]
    reply = client.chat.completions.create(model=model, messages=messages, max_tokens=3, n=3, seed=7)
    assert [choice.index for choice in reply.choices] == [0, 1, 2]
    assert all(choice.message.content for choice in reply.choices)
    assert 3 <= reply.usage.completion_tokens <= 9  # summed over the choices, each 1 to max_tokens
    text: dict[int, str] = {}
    finished = set()
    for chunk in client.chat.completions.create(
        model=model, messages=messages, max_tokens=3, n=2, stream=True
    ):
        for choice in chunk.choices:
            text[choice.index] = text.get(choice.index, "") + (choice.delta.content or "")
            if choice.finish_reason:
                finished.add(choice.index)
    assert sorted(text) == [0, 1] and finished == {0, 1} and all(text.values())


@pytest.mark.parametrize("n", [0, 129, "two"])
def test_a_bad_n_gets_400(api, n):
    base_url, model, _ = api
    answer = httpx.post(
        f"{base_url}/chat/completions",
        timeout=10,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": n},
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "n"


ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
        },
    },
}
CALL_ADD = {"type": "function", "function": {"name": "add"}}
ADDITION = [{"role": "user", "content": "What is 2 + 3? Use the add function."}]


def _continues_messages(request) -> None:
    if request.node.callspec.params["api"] == "transformers":
        pytest.skip("`transformers serve` does not continue an assistant message (a forced call opens one)")


def test_a_tool_round_trip_through_the_openai_client(api, request):
    """A call (tool_choice names the function, so the 135M model calls it), the function's result sent back as
    a tool message, and the model's answer to it, all through the `openai` client."""
    _continues_messages(request)
    base_url, model, _ = api
    client = _client(base_url)
    asked = client.chat.completions.create(
        model=model, messages=ADDITION, tools=[ADD], tool_choice=CALL_ADD, max_tokens=48, temperature=0
    )
    (choice,) = asked.choices
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    assert isinstance(call.function.arguments, str) and choice.message.content is None
    assert choice.finish_reason == ("length" if asked.usage.completion_tokens == 48 else "tool_calls")
    answered = client.chat.completions.create(
        model=model,
        messages=[
            *ADDITION,
            {"role": "assistant", "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "5"},
        ],
        tools=[ADD],
        tool_choice="none",
        max_tokens=24,
        temperature=0,
    )
    assert answered.choices[0].message.content and not answered.choices[0].message.tool_calls
    alone = client.chat.completions.create(model=model, messages=ADDITION, max_tokens=1, temperature=0)
    # the call and its result reached the model: the conversation is the question and at least the call's
    # tokens
    assert answered.usage.prompt_tokens >= alone.usage.prompt_tokens + min(asked.usage.completion_tokens, 8)


def test_a_streamed_call_comes_as_one_tool_calls_delta(api, request):
    _continues_messages(request)
    base_url, model, _ = api
    chunks = list(
        _client(base_url).chat.completions.create(
            model=model,
            messages=ADDITION,
            tools=[ADD],
            tool_choice=CALL_ADD,
            max_tokens=48,
            temperature=0,
            stream=True,
        )
    )
    calls = [call for chunk in chunks for choice in chunk.choices for call in choice.delta.tool_calls or []]
    finishes = [choice.finish_reason for chunk in chunks for choice in chunk.choices if choice.finish_reason]
    content = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    assert [call.function.name for call in calls] == ["add"] and calls[0].index == 0 and content == ""
    assert finishes in (["tool_calls"], ["length"])
    whole = _client(base_url).chat.completions.create(
        model=model, messages=ADDITION, tools=[ADD], tool_choice=CALL_ADD, max_tokens=48, temperature=0
    )
    assert whole.choices[0].message.tool_calls[0].function.arguments == calls[0].function.arguments


def test_the_openai_agents_sdk_runs_its_tool_loop_against_the_endpoint(api, request):
    """The OpenAI Agents SDK's own loop: the model's call reaches the SDK as a function call with JSON
    arguments, the SDK answers it with a tool output, and the model's next reply is the agent's final output.
    The untrained 135M model does not know `add`'s parameters (it writes a schema-like object), so the SDK's
    output is its validation error; a model trained on calls gets its function run the same way."""
    _continues_messages(request)
    agents = pytest.importorskip("agents")
    from agents.items import ToolCallItem, ToolCallOutputItem

    agents.set_tracing_disabled(True)  # no trace export: nothing leaves 127.0.0.1
    base_url, model, _ = api
    ran = []

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        ran.append((a, b))
        return a + b

    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    agent = agents.Agent(
        name="calculator",
        instructions="Use the add function to answer.",
        tools=[add],
        model=agents.OpenAIChatCompletionsModel(model=model, openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="add", temperature=0, max_tokens=48),
    )
    result = agents.Runner.run_sync(agent, "What is 2 + 3?", max_turns=4)
    (called,) = [item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert called.raw_item.name == "add" and isinstance(json.loads(called.raw_item.arguments), dict)
    (answered,) = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert answered.raw_item["call_id"] == called.raw_item.call_id
    assert isinstance(result.final_output, str) and result.final_output
    assert len(ran) <= 1  # run only when the arguments validate


FRUIT = {
    "type": "object",
    "properties": {"answer": {"type": "integer"}, "unit": {"type": "string", "enum": ["apples", "pears"]}},
    "required": ["answer", "unit"],
    "additionalProperties": False,
}
APPLES = [{"role": "user", "content": "Tom has 2 apples and gets 3 more. How many apples? Reply in JSON."}]


def test_a_json_schema_reply_is_json_that_follows_the_schema_whole_and_streamed(api, request):
    """Constrained decoding (llguidance) on the sampler: the 135M model's reply parses and validates against
    the schema, streamed or not; `transformers serve` cannot constrain, and says so (400)."""
    jsonschema = pytest.importorskip("jsonschema")
    base_url, model, _ = api
    asked = {
        "model": model,
        "messages": APPLES,
        "max_tokens": 60,
        "temperature": 0,
        "response_format": {"type": "json_schema", "json_schema": {"name": "fruit", "schema": FRUIT}},
    }
    client = _client(base_url)
    if request.node.callspec.params["api"] == "transformers":
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**asked)
        assert caught.value.body["param"] == "response_format"
        return
    whole = client.chat.completions.create(**asked)
    assert whole.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(whole.choices[0].message.content), FRUIT)
    streamed = client.chat.completions.create(**asked, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == (
        whole.choices[0].message.content
    )
    # json_object: a JSON object, sampled (a seed: the same reply on a rerun)
    free = client.chat.completions.create(
        **{
            **asked,
            "response_format": {"type": "json_object"},
            "temperature": 1.0,
            "seed": 3,
            "max_tokens": 200,
        }
    )
    text = free.choices[0].message.content
    assert text.startswith("{") and (
        free.choices[0].finish_reason == "length" or isinstance(json.loads(text), dict)
    )


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its descendants that are still running."""
    total, pending = 0.0, [pid]
    while pending:
        current = pending.pop()
        try:
            fields = Path(f"/proc/{current}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            for task in Path(f"/proc/{current}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _goes_idle(pid: int, within_s: float = 30.0) -> bool:
    """Whether the server uses under 1 s of CPU in some 3 s window within `within_s` of now. Generating the
    4,000 tokens asked for would keep it busy for minutes; on a loaded machine cancelling takes a few
    seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        before = _cpu_seconds(pid)
        time.sleep(3.0)
        if _cpu_seconds(pid) - before < 1.0:
            return True
    return False


def test_a_client_that_disconnects_stops_its_generation(api):
    base_url, model, pid = api
    request = {
        "model": model,
        "messages": [{"role": "user", "content": "Count from 1 to 5000."}],
        "max_tokens": 4000,
        "temperature": 0,
    }  # greedy: it counts on for minutes; a sample may stop early
    with pytest.raises(httpx.ReadTimeout):  # non-streaming: the client gives up after 2 s
        httpx.post(f"{base_url}/chat/completions", json=request, timeout=httpx.Timeout(2.0, connect=5.0))
    assert _goes_idle(pid), "the model server kept generating for a client that had gone"
    with _client(base_url).chat.completions.create(
        model=model, messages=request["messages"], max_tokens=4000, temperature=0, stream=True
    ) as stream:
        next(iter(stream))  # a streaming client that leaves after its first piece
    assert _goes_idle(pid), "the model server kept generating for a streaming client that had gone"


def test_sampling_follows_temperature_and_seed_as_an_openai_client_expects(api):
    """T > 0 samples (8 choices of 12 tokens, not all the same), a seed repeats them, T = 0 decodes greedily
    (the same text whatever the seed). `transformers serve` alone decoded every request greedily."""
    base_url, model, _ = api
    client = _client(base_url)
    messages = [{"role": "user", "content": "Write a short sentence about the sea."}]

    def texts(**sampling) -> list[str]:
        reply = client.chat.completions.create(model=model, messages=messages, max_tokens=12, **sampling)
        return [choice.message.content for choice in reply.choices]

    hot = texts(n=8, temperature=1.5, seed=1)
    assert len(set(hot)) >= 4, hot
    assert texts(n=8, temperature=1.5, seed=1) == hot
    greedy = texts(n=3, temperature=0, seed=5)
    assert len(set(greedy)) == 1 and texts(temperature=0, seed=9) == greedy[:1]
    # top_p 0 keeps only the most likely token (OpenAI's bounds are [0, 1]; both engines take it)
    assert texts(n=2, temperature=1.5, top_p=0, seed=3) == greedy[:1] * 2


@pytest.mark.parametrize(
    ("field", "value"),
    [("temperature", 2.5), ("top_p", 1.5), ("top_p", -0.1), ("seed", "x"), ("temperature", True)],
)
def test_a_sampling_field_out_of_openais_range_gets_400_naming_it(api, field, value):
    base_url, model, _ = api
    answer = httpx.post(
        f"{base_url}/chat/completions",
        timeout=10,
        json={"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value},
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == field


def test_concurrent_streams_are_decoded_together(api, request):
    """8 streams sent at once: with the sampler every stream's first piece arrives before any stream has ended
    (one request at a time, the last would start only after the others ended), and each greedy reply is the
    one the same request gets alone."""
    if request.node.callspec.params["api"] != "sampler":
        pytest.skip("`transformers serve` answers one request at a time (the front serialises it)")
    import asyncio
    import json

    base_url, model, _ = api
    # replies that run to max_tokens: a short one could end before the last request has even arrived
    questions = [
        f"Write the numbers from {start} to {start + 60}, separated by commas." for start in range(1, 81, 10)
    ]

    async def stream(client: httpx.AsyncClient, question: str) -> tuple[float, float, str]:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": question}],
            "max_tokens": 40,
            "temperature": 0,
            "stream": True,
        }
        first, text = None, ""
        async with client.stream("POST", f"{base_url}/chat/completions", json=body) as reply:
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    for choice in json.loads(line[6:])["choices"]:
                        if piece := (choice.get("delta") or {}).get("content"):
                            first = first or time.monotonic()
                            text += piece
        return first, time.monotonic(), text

    async def together() -> list[tuple[float, float, str]]:
        async with httpx.AsyncClient(timeout=300) as client:
            return await asyncio.gather(*(stream(client, question) for question in questions))

    replies = asyncio.run(together())
    assert max(first for first, _, _ in replies) < min(end for _, end, _ in replies)
    client = _client(base_url)
    for question in (questions[0], questions[-1]):
        alone = (
            client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": question}], max_tokens=40, temperature=0
            )
            .choices[0]
            .message.content
        )
        assert alone == replies[questions.index(question)][2]


def test_stop_strings_end_the_reply_before_them(api, request):
    if request.node.callspec.params["api"] != "sampler":
        pytest.skip("`transformers serve` keeps the stop string in the reply (docs/serve.md)")
    base_url, model, _ = api
    messages = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    full = _client(base_url).chat.completions.create(
        model=model, messages=messages, max_tokens=60, temperature=0
    )
    text = full.choices[0].message.content
    assert "7" in text, text
    cut = _client(base_url).chat.completions.create(
        model=model, messages=messages, max_tokens=60, temperature=0, stop=["7"]
    )
    assert cut.choices[0].message.content == text[: text.index("7")]
    assert cut.choices[0].finish_reason == "stop"


def test_ignore_eos_generates_exactly_max_tokens_as_vllms_field_does(api, request):
    """vLLM's `ignore_eos` (what serving benchmarks send for equal work per request): a greedy reply that ends
    early without it runs to max_tokens with it, as one response and as a stream."""
    base_url, model, _ = api
    client = _client(base_url)
    ask = {
        "model": model,
        "messages": [{"role": "user", "content": "Say hi."}],
        "temperature": 0,
        "max_tokens": 48,
    }
    if request.node.callspec.params["api"] != "sampler":
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
        assert caught.value.body["param"] == "ignore_eos"
        return
    short = client.chat.completions.create(**ask)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 48
    full = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 48
    stream = client.chat.completions.create(
        **ask, extra_body={"ignore_eos": True}, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert chunks[-1].usage.completion_tokens == 48
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == [
        "length"
    ]
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(**ask, extra_body={"ignore_eos": "yes"})
    assert caught.value.body["param"] == "ignore_eos"


def test_a_wrong_model_is_404_before_any_stream_and_errors_have_openais_shape(api):
    base_url, _, _ = api
    client = _client(base_url)
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as caught:
            reply = client.chat.completions.create(
                model="no-such-model",
                stream=stream,
                max_tokens=4,
                messages=[{"role": "user", "content": "Hi"}],
            )
            list(reply) if stream else None
        assert caught.value.status_code == 404 and caught.value.body["code"] == "model_not_found"
    answer = httpx.post(f"{base_url}/chat/completions", json={"messages": [], "max_tokens": 0}, timeout=30)
    assert answer.status_code == 400 and set(answer.json()["error"]) == {"message", "type", "param", "code"}
    answer = httpx.post(
        f"{base_url}/chat/completions",
        json={"messages": [{"role": "user", "content": "Hi"}], "temperature": 7},
        timeout=30,
    )
    assert answer.status_code == 400 and answer.json()["error"]["param"] == "temperature"


@pytest.mark.slow  # two evaluations, about 3 minutes
def test_eval_through_the_endpoint_samples_as_many_distinct_answers_as_the_hf_engine(api, tmp_path):
    """`dapo-suite eval --endpoint` at T 1.0, top_p 0.7 gave one distinct sample of four per problem (the
    endpoint decoded greedily); now as many as eval's own HF engine with the same settings."""
    import json as json_lib

    from click.testing import CliRunner

    from dapo_suite.cli import main
    from eval.scoring import read_generations

    base_url, model, _ = api
    settings = ["--n", "4", "--limit", "3", "--max-tokens", "16", "--temperature", "1.0", "--top-p", "0.7"]
    distinct = {}
    for name, engine in (
        ("endpoint", ["--endpoint", base_url, "--model", model]),
        ("hf", ["--engine", "hf"]),
    ):
        result = CliRunner().invoke(
            main, ["eval", "gsm8k", *engine, *settings, "--out", str(tmp_path / name)], catch_exceptions=False
        )
        assert result.exit_code == 0, result.output
        texts: dict[str, set[str]] = {}
        for record in read_generations(tmp_path / name / "generations.jsonl"):
            texts.setdefault(record["problem_id"], set()).add(record["text"])
        distinct[name] = sum(len(group) for group in texts.values())
        assert json_lib.loads((tmp_path / name / "results.json").read_text())["num_samples"] == 12
    assert distinct["endpoint"] >= min(distinct["hf"], 10) and distinct["endpoint"] > 3, distinct


@pytest.mark.slow  # lm-eval's imports and two evaluations, about a minute
def test_lm_eval_local_completions_scores_a_multiple_choice_task_as_its_hf_model_does(
    api, request, tmp_path, embedded_model_dir, monkeypatch
):
    """lm-evaluation-harness's `local-completions` against the endpoint on a two-question multiple-choice
    task: each choice's log-likelihood and greedy flag equal lm-eval's own Hugging Face backend's on the same
    model (float32)."""
    if request.node.callspec.params["api"] != "sampler":
        pytest.skip("`transformers serve` gives no log-probs (400, tested above)")
    lm_eval = pytest.importorskip("lm_eval")
    pytest.importorskip("tenacity")  # lm-eval's API models need lm_eval[api]
    import json

    from lm_eval.tasks import TaskManager

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # the task's rows are a local file
    base_url, model, _ = api
    rows = [
        {"question": "What is 2 + 2?", "choices": ["4", "5", "22"], "answer": 0},
        {
            "question": "What colour is the sky on a clear day?",
            "choices": ["green", "blue", "red"],
            "answer": 1,
        },
    ]
    (tmp_path / "tiny.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (tmp_path / "tiny.yaml").write_text(
        "task: dapo_tiny_choice\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
        f"{tmp_path / 'tiny.jsonl'}\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\ndoc_to_target: answer\nmetric_list:\n  - metric: acc\n'
    )

    def scores(backend: str, args: str) -> list[tuple[float, bool]]:
        out = lm_eval.simple_evaluate(
            model=backend,
            model_args=args,
            tasks=["dapo_tiny_choice"],
            batch_size=2,
            task_manager=TaskManager(include_path=str(tmp_path)),
            log_samples=True,
        )
        return [resp[0] for sample in out["samples"]["dapo_tiny_choice"] for resp in sample["resps"]]

    served = scores(
        "local-completions",
        f"model={model},base_url={base_url}/completions,tokenizer="
        f"{embedded_model_dir},tokenizer_backend=huggingface,max_retries=1",
    )
    own = scores("hf", f"pretrained={embedded_model_dir},dtype=float32,device=cpu")
    assert len(served) == len(own) == 6
    for (served_ll, served_greedy), (own_ll, own_greedy) in zip(served, own, strict=True):
        assert abs(served_ll - own_ll) < 1e-4 and served_greedy == own_greedy
