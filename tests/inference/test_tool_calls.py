"""Function calling written into plain messages and read back out of replies (`tool_calls.py`): what the model
sees for each tool_choice, the calls read from whole and streamed replies, and a 400 naming the field for
every malformed tool, tool_choice, call or tool message."""

from __future__ import annotations

import json

import pytest

from dapo_suite.inference.openai_fields import RequestFieldError
from dapo_suite.inference.tool_calls import (
    OPEN,
    ToolCalling,
    ToolCallStream,
    plain_request,
    tool_calls_of,
    with_tool_calls,
)

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers.",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def test_tools_become_a_system_message_and_no_tool_field_reaches_the_server():
    plain, calling = plain_request({"messages": QUESTION, "tools": [ADD], "parallel_tool_calls": False})
    assert set(plain) == {"messages"} and calling == ToolCalling(("add",), parallel=False)
    system, user = plain["messages"]
    assert system["role"] == "system" and json.dumps(ADD["function"]) in system["content"]
    assert "<tool_call>" in system["content"] and user == QUESTION[0]
    # a system message of the caller's keeps its text, the tools after it
    plain, _ = plain_request(
        {"messages": [{"role": "system", "content": "Be brief."}, *QUESTION], "tools": [ADD]}
    )
    assert plain["messages"][0]["content"].startswith("Be brief.\n\n# Tools") and len(plain["messages"]) == 2


def test_a_named_or_required_choice_opens_the_reply_with_the_call_and_none_describes_nothing():
    plain, calling = plain_request(
        {
            "messages": QUESTION,
            "tools": [ADD],
            "tool_choice": {"type": "function", "function": {"name": "add"}},
        }
    )
    assert plain["messages"][-1] == {"role": "assistant", "content": calling.prefix}
    assert calling.prefix == OPEN + '\n{"name": "add", "arguments": {'  # arguments are an object
    assert plain["continue_final_message"] is True and plain["add_generation_prompt"] is False
    _, required = plain_request({"messages": QUESTION, "tools": [ADD], "tool_choice": "required"})
    assert required.prefix == OPEN + '\n{"name": "'
    plain, calling = plain_request({"messages": QUESTION, "tools": [ADD], "tool_choice": "none"})
    assert calling is None and plain["messages"] == QUESTION


def test_a_conversation_with_calls_and_results_is_written_as_the_model_reads_it():
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}
    messages = [
        *QUESTION,
        {"role": "assistant", "content": None, "tool_calls": [call, {**call, "id": "call_2"}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"},
        {"role": "tool", "tool_call_id": "call_2", "content": "5"},
    ]
    plain, _ = plain_request({"messages": messages, "tools": [ADD]})
    assistant, results = plain["messages"][2:]
    one = OPEN + '\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert assistant == {"role": "assistant", "content": one + "\n" + one}
    response = "<tool_response>\n5\n</tool_response>"
    assert results == {"role": "user", "content": response + "\n" + response}  # one turn for both results


def test_calls_are_read_from_a_whole_reply_text_before_them_is_content():
    calling = ToolCalling(("add",))
    text = 'I will add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>\n<tool_call>\n'
    content, calls = tool_calls_of(text + '{"name": "add", "arguments": {"b": 1}}', calling)
    assert content == "I will add." and [json.loads(c["function"]["arguments"]) for c in calls] == [
        {"a": 2},
        {"b": 1},
    ]
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert len(tool_calls_of(text, ToolCalling(("add",), parallel=False))[1]) == 1
    # text the model writes on after the call's JSON is no part of it
    _, (call,) = tool_calls_of(
        '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n\nThe result is 5.', calling
    )
    assert call["function"]["arguments"] == '{"a": 1}'
    # a block naming no function of the request is text; broken JSON keeps the model's arguments as written
    assert tool_calls_of('<tool_call>{"name": "mul", "arguments": {}}</tool_call>', calling)[1] == []
    _, (broken,) = tool_calls_of('<tool_call>\n{"name": "add", "arguments": {"a": 2,', calling)
    assert broken["function"] == {"name": "add", "arguments": '{"a": 2,'}


def test_a_response_gets_tool_calls_and_keeps_length_where_max_tokens_cut_it():
    calling = ToolCalling(("add",), prefix=OPEN + '\n{"name": "add", "arguments": ')
    response = {
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": '{"a": 1}}\n</tool_call>'},
                "finish_reason": "stop",
            },
            {"index": 1, "message": {"role": "assistant", "content": '{"a": '}, "finish_reason": "length"},
        ]
    }
    first, second = with_tool_calls(response, calling)["choices"]
    assert first["finish_reason"] == "tool_calls" and first["message"]["content"] is None
    assert first["message"]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert (
        second["finish_reason"] == "length"
        and second["message"]["tool_calls"][0]["function"]["name"] == "add"
    )


def test_a_streamed_reply_sends_text_until_a_call_starts_and_holds_a_possible_start():
    stream = ToolCallStream(ToolCalling(("add",)))
    pieces = ["The sum ", "is <tool", '_call>\n{"name": "add", "arguments": {"a": 1}}', "\n</tool_call>"]
    assert [stream.push(piece) for piece in pieces] == ["The sum ", "is ", "", ""]
    rest, calls = stream.finish()
    assert rest == "" and calls[0]["function"] == {"name": "add", "arguments": '{"a": 1}'}
    text = ToolCallStream(ToolCalling(("add",)))
    assert [text.push(piece) for piece in ["x <tool", "s> y"]] == ["x ", "<tools> y"] and text.finish() == (
        "",
        [],
    )
    unknown = ToolCallStream(ToolCalling(("add",)))
    assert unknown.push('a <tool_call>{"name": "mul"}') == "a "
    assert unknown.finish() == ('<tool_call>{"name": "mul"}', [])  # no call after all: the text, held back


BAD = [  # (request fields, the param a 400 names)
    ({"tools": []}, None),
    ({"tools": {"add": ADD}}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "add two"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "code_interpreter"}]}, "tools[0]"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": "x"}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [ADD, ADD]}, "tools"),
    ({"tools": [ADD], "tool_choice": {"type": "function", "function": {"name": "mul"}}}, "tool_choice"),
    ({"tools": [ADD], "tool_choice": "sometimes"}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [ADD], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"messages": [*QUESTION, {"role": "tool", "content": "5"}]}, "messages[1].tool_call_id"),
    (
        {"messages": [*QUESTION, {"role": "assistant", "tool_calls": [{"id": "c"}]}]},
        "messages[1].tool_calls[0]",
    ),
]


@pytest.mark.parametrize(("fields", "param"), BAD, ids=[param or "empty tools" for _, param in BAD])
def test_a_malformed_tool_request_names_its_field(fields, param):
    body = {"messages": QUESTION, **fields}
    if param is None:  # empty tools: the request is a plain chat
        assert plain_request(body) == ({"messages": QUESTION}, None)
        return
    with pytest.raises(RequestFieldError) as caught:
        plain_request(body)
    assert caught.value.param == param
