"""The one OpenAI request parser of the sampler server and `serve api`'s front
(dapo_suite/inference/openai_fields.py), on the embedded model's tokenizer, without a server: what it refuses
and the field it names, what it accepts."""

from __future__ import annotations

import pytest

from dapo_suite.inference.openai_fields import RequestFieldError, parse_request

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def tokenizer(embedded_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_model_dir)


@pytest.mark.parametrize(
    ("chat", "body", "param"),
    [
        (True, {"messages": HI, "logprobs": "yes"}, "logprobs"),
        (True, {"messages": HI, "echo": True}, "echo"),  # a completions field
        (True, {"messages": HI, "max_completion_tokens": 0}, "max_completion_tokens"),
        (True, {"messages": HI, "stream_options": "usage"}, "stream_options"),
        (True, {"messages": HI, "model": 7}, "model"),
        (True, {"messages": [HI[0], "Hi"]}, "messages[1]"),
        (True, {}, "messages"),
        (False, {"prompt": "1,", "logprobs": True}, "logprobs"),
        (
            False,
            {"prompt": "1,", "max_tokens": 0},
            "max_tokens",
        ),  # 0 only with echo: scoring the prompt alone
        (False, {"prompt": [1.5]}, "prompt"),
        (False, {"prompt": "1,", "best_of": 3}, "best_of"),
    ],
)
def test_what_openai_refuses_is_refused_naming_the_field(tokenizer, chat, body, param):
    with pytest.raises(RequestFieldError) as caught:
        parse_request(body, chat, tokenizer, 8192)
    assert caught.value.param == param


def test_a_conversation_the_chat_template_refuses_is_a_400_on_messages(tokenizer):
    """A template that needs the last message to be the user's (as many do, by jinja's raise_exception)."""
    strict = tokenizer.__class__.from_pretrained(tokenizer.name_or_path)
    strict.chat_template = (
        "{% if messages[-1]['role'] != 'user' %}{{ raise_exception('the last message must be "
        "the user\\'s') }}{% endif %}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    )
    conversation = [*HI, {"role": "assistant", "content": "Hello"}]
    with pytest.raises(RequestFieldError, match="the last message must be the user's") as caught:
        parse_request({"messages": conversation}, True, strict, 8192)
    assert caught.value.param == "messages"
    assert parse_request({"messages": HI}, True, strict, 8192).prompts


def test_accepted_requests_read_as_openai_means_them(tokenizer):
    chat = parse_request(
        {
            "messages": [
                {"role": "developer", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            ],
            "logprobs": True,
            "top_logprobs": 0,
            "presence_penalty": 0,
            "tools": [],
            "user": "u",
            "max_completion_tokens": 5,
        },
        True,
        tokenizer,
        8192,
    )
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "a\nb"}]
    assert chat.top_logprobs == 0 and chat.max_tokens == 5 and len(chat.prompts) == 1
    plain = parse_request({"messages": HI}, True, tokenizer, 8192)
    assert plain.top_logprobs is None and plain.max_tokens == 1024 and plain.sampling.temperature == 1.0
    batch = parse_request(
        {"prompt": [[1, 2, 3], "1, 2,"], "echo": True, "max_tokens": 0, "logprobs": 1}, False, tokenizer, 8192
    )
    assert (
        batch.prompts[0] == [1, 2, 3] and len(batch.prompts) == 2 and batch.echo and batch.top_logprobs == 1
    )


def test_an_engine_without_log_probs_refuses_them_by_name(tokenizer):
    for chat, body, param in (
        (True, {"messages": HI, "logprobs": True}, "logprobs"),
        (True, {"messages": HI, "logprobs": True, "top_logprobs": 2}, "top_logprobs"),
        (False, {"prompt": "1,", "echo": True}, "echo"),
    ):
        with pytest.raises(RequestFieldError) as caught:
            parse_request(body, chat, tokenizer, 8192, token_engine=False)
        assert caught.value.param == param
