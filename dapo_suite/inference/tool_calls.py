"""OpenAI function calling over any chat model server, in the Hermes format: the functions are described to
the model in a system message, a call is a `<tool_call>` block of JSON `{"name": ..., "arguments": {...}}`,
and a function's result goes back as a `<tool_response>` block (the format Qwen2.5's and Hermes' chat
templates render, and verl's hermes tool parser reads).

`plain_request` turns a request with `tools` into one every server takes (plain messages, no tool fields), and
returns the `ToolCalling` that reads the reply: `tool_calls_of` on a whole reply text, `ToolCallStream` on a
streamed one. `serve api` does both, so function calling works the same whatever engine is behind it (the
sampler, vLLM, `transformers serve`).

`tool_choice`: "auto" (default with tools) lets the model choose; "none" describes no function and reads no
call; "required" and a named function open the assistant's reply with the start of a call (`<tool_call>` and,
for a named one, its name), which the model continues (`continue_final_message`), so the reply is a call.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from dapo_suite.inference.openai_fields import RequestFieldError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a function name
CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*(?:" + re.escape(CLOSE) + r"|$)", re.S)
INSTRUCTIONS = """# Tools

You may call one or more of these functions to help with the user's request. Their signatures, one JSON object
a line, are inside <tools></tools>:
<tools>
{signatures}
</tools>

To call a function, write a JSON object with its name and arguments inside <tool_call></tool_call>:
<tool_call>
{{"name": <function-name>, "arguments": <arguments-json-object>}}
</tool_call>
The result comes back inside <tool_response></tool_response>."""


@dataclass(frozen=True)
class ToolCalling:
    """How a request's reply is read for calls: the functions it may call (`names`), whether several calls may
    come in one reply (`parallel`), and the text the reply was opened with (`prefix`: a forced call's
    start)."""

    names: tuple[str, ...]
    parallel: bool = True
    prefix: str = ""


def _function_names(tools: Any) -> list[dict]:
    if not isinstance(tools, list) or not tools:
        raise RequestFieldError(
            "tools must be a non-empty list of {type: function, function: {...}}", "tools"
        )
    functions = []
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(tool.get("function"), dict)
        ):
            raise RequestFieldError(f"{where} must be {{type: function, function: {{name, ...}}}}", where)
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise RequestFieldError(
                f"{where}.function.name={name!r}: 1-64 letters, digits, _ or -", f"{where}.function.name"
            )
        if "parameters" in function and not isinstance(function["parameters"], dict):
            raise RequestFieldError(
                f"{where}.function.parameters must be a JSON Schema object", f"{where}.function.parameters"
            )
        functions.append(function)
    if len({function["name"] for function in functions}) < len(functions):
        raise RequestFieldError("tools: two functions share a name", "tools")
    return functions


def _choice(tool_choice: Any, names: list[str]) -> str:
    """ "auto", "none", "required", or the one function's name."""
    if tool_choice is None:
        return "auto"
    if tool_choice in ("auto", "none", "required"):
        return tool_choice
    named = isinstance(tool_choice, dict) and tool_choice.get("type") == "function"
    function = tool_choice.get("function") if named else None
    name = function.get("name") if isinstance(function, dict) else None
    if name not in names:
        raise RequestFieldError(
            f'tool_choice={tool_choice!r}: "auto", "none", "required" or '
            f"{{type: function, function: {{name}}}} naming one of {', '.join(names)}",
            "tool_choice",
        )
    return name


def call_text(name: str, arguments: Any) -> str:
    """One call as the model writes it; `arguments` a JSON string (as OpenAI sends it back) or an object."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass  # kept as the string the model wrote
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': arguments})}\n{CLOSE}"


def _plain_messages(messages: Any) -> list[dict]:
    """The conversation with assistant `tool_calls` written out as calls and `tool` results as user turns."""
    if not isinstance(messages, list):
        return messages  # parse_request names the problem
    plain = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            plain.append(message)
            continue
        where = f"messages[{index}]"
        if message.get("role") == "tool":
            content = message.get("content")
            if not isinstance(message.get("tool_call_id"), str):
                raise RequestFieldError(
                    f"{where}: a tool message needs tool_call_id (the call it answers)",
                    f"{where}.tool_call_id",
                )
            text = content if isinstance(content, str) else json.dumps(content)
            turn = f"<tool_response>\n{text}\n</tool_response>"
            if plain and plain[-1].get("role") == "user" and plain[-1].get("tool_results"):
                plain[-1] = {
                    **plain[-1],
                    "content": plain[-1]["content"] + "\n" + turn,
                }  # results of one turn
            else:
                plain.append({"role": "user", "content": turn, "tool_results": True})
            continue
        calls = message.get("tool_calls")
        if message.get("role") == "assistant" and calls is not None:
            if not isinstance(calls, list):
                raise RequestFieldError(f"{where}.tool_calls must be a list of calls", f"{where}.tool_calls")
            texts = (
                [message["content"]] if isinstance(message.get("content"), str) and message["content"] else []
            )
            for number, call in enumerate(calls):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise RequestFieldError(
                        f"{where}.tool_calls[{number}] must be {{id, type: function, "
                        "function: {name, arguments}}",
                        f"{where}.tool_calls[{number}]",
                    )
                texts.append(call_text(function["name"], function.get("arguments", "{}")))
            plain.append({"role": "assistant", "content": "\n".join(texts)})
            continue
        plain.append(message)
    return [
        {key: value for key, value in message.items() if key != "tool_results"}
        if isinstance(message, dict)
        else message
        for message in plain
    ]


def plain_request(body: dict) -> tuple[dict, ToolCalling | None]:
    """`body` with its function calling written into the messages (and the tool fields removed), and how to
    read the reply's calls (None: the request has no tools, or tool_choice "none"). RequestFieldError names a
    malformed tool, tool_choice, tool call or tool message."""
    tools = body.get("tools")
    plain = {
        key: value
        for key, value in body.items()
        if key not in ("tools", "tool_choice", "parallel_tool_calls")
    }
    if "messages" in body:
        plain["messages"] = _plain_messages(body["messages"])
    if tools is None or tools == []:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise RequestFieldError("tool_choice needs tools", "tool_choice")
        return plain, None
    functions = _function_names(tools)
    names = [function["name"] for function in functions]
    choice = _choice(body.get("tool_choice"), names)
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise RequestFieldError(
            f"parallel_tool_calls={parallel!r}: must be true or false", "parallel_tool_calls"
        )
    if choice == "none":
        return plain, None
    if "continue_final_message" in body:
        raise RequestFieldError(
            "continue_final_message cannot be combined with tools", "continue_final_message"
        )
    signatures = "\n".join(json.dumps({"type": "function", "function": function}) for function in functions)
    described = INSTRUCTIONS.format(signatures=signatures)
    messages = list(plain["messages"]) if isinstance(plain.get("messages"), list) else []
    if (
        messages
        and isinstance(messages[0], dict)
        and messages[0].get("role") in ("system", "developer")
        and isinstance(messages[0].get("content"), str)
    ):
        messages[0] = {**messages[0], "content": messages[0]["content"] + "\n\n" + described}
    else:
        messages.insert(0, {"role": "system", "content": described})
    # a named call opens its arguments too: they are a JSON object, whatever the model would write first
    opened = {"auto": "", "required": OPEN + '\n{"name": "'}
    prefix = opened.get(choice, OPEN + "\n" + json.dumps({"name": choice})[:-1] + ', "arguments": {')
    if prefix:
        messages.append({"role": "assistant", "content": prefix})
        plain |= {"continue_final_message": True, "add_generation_prompt": False}
    plain["messages"] = messages
    return plain, ToolCalling(tuple(names), parallel, prefix)


def _call(block: str, names: tuple[str, ...]) -> dict | None:
    """An OpenAI tool call from one block's text, or None when it names no function of the request. The
    arguments are what the model wrote, as a JSON string (OpenAI's own may not parse either)."""
    try:  # the first JSON value of the block; the model may write on after it
        written, _ = json.JSONDecoder().raw_decode(block)
    except ValueError:
        written = None
    if isinstance(written, dict) and written.get("name") in names:
        arguments = written.get("arguments", {})
        arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
        name = written["name"]
    else:  # broken JSON: the name and the raw arguments, when the name is readable
        found = re.match(
            r'\{\s*"name"\s*:\s*"([^"]*)"\s*,?\s*(?:"arguments"\s*:\s*)?(.*?)\}?\s*$', block, re.S
        )
        if not found or found.group(1) not in names:
            return None
        name, arguments = found.group(1), found.group(2).strip() or "{}"
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def tool_calls_of(text: str, calling: ToolCalling) -> tuple[str | None, list[dict]]:
    """(content, calls) of a reply: the text before the first call (None when empty and there are calls) and
    every call (the first only, without parallel calls). A block naming no function of the request stays
    text."""
    text = calling.prefix + text
    calls = [call for call in (_call(match.group(1), calling.names) for match in CALL.finditer(text)) if call]
    if not calls:
        return text, []
    content = text[: text.index(OPEN)].strip()
    return content or None, calls if calling.parallel else calls[:1]


def with_tool_calls(response: dict, calling: ToolCalling) -> dict:
    """A whole chat response with each choice's calls read out of its text: `message.tool_calls` and
    `finish_reason` "tool_calls" where the model called (as OpenAI, "length" where max_tokens cut the reply),
    the text as content where it did not."""
    for choice in response.get("choices") or []:
        message = choice.get("message") or {}
        content, calls = tool_calls_of(message.get("content") or "", calling)
        choice["message"] = {**message, "content": content, **({"tool_calls": calls} if calls else {})}
        if calls and choice.get("finish_reason") != "length":  # a call cut by max_tokens stays "length"
            choice["finish_reason"] = "tool_calls"
    return response


@dataclass
class ToolCallStream:
    """A streamed choice's text read for calls: `push` gives the content to send now (the text before a call
    starts; what might be the start of `<tool_call>` waits for the next piece), `finish` the rest once the
    choice has ended: the calls, or the text held back when it was no call after all."""

    calling: ToolCalling
    pieces: list[str] = field(default_factory=list)
    sent: int = 0  # characters of (prefix + text) sent as content

    def push(self, piece: str) -> str:
        self.pieces.append(piece)
        text = self.calling.prefix + "".join(self.pieces)
        if OPEN in text:
            end = text.index(OPEN)
        else:
            end = len(text) - max(
                (size for size in range(1, len(OPEN)) if text.endswith(OPEN[:size])), default=0
            )
        ready, self.sent = text[self.sent : max(end, self.sent)], max(end, self.sent)
        return ready

    def finish(self) -> tuple[str, list[dict]]:
        """(content still to send, the calls)."""
        content, calls = tool_calls_of("".join(self.pieces), self.calling)
        if calls:
            return "", calls
        return (self.calling.prefix + "".join(self.pieces))[self.sent :], []
