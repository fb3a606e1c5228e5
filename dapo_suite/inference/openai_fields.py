"""An OpenAI request read and checked once for every server of the project (`parse_request`): the sampler
server and `serve api`'s front answer the same request the same way, 400 with OpenAI's error shape naming the
offending `param`, never 500.

What is checked, as OpenAI checks it: `messages` (a non-empty list; roles system, developer, user, assistant;
content a string or a list of text parts) or `prompt` (a string, a list of strings, a list of token ids or a
list of such lists); the sampling fields `n`, `temperature` (0-2), `top_p` (0-1), `seed`; `max_tokens` /
`max_completion_tokens` against the model's context; `stop`; vLLM's `ignore_eos` (exactly max_tokens tokens);
`logprobs` and `top_logprobs` (chat: a bool and 0-20; completions: an int 0-5 and `echo`); and every other
field: one this server does not implement gets 400 unless it is one that cannot change the reply (`user`,
`metadata`, ...) or has its neutral value (`presence_penalty: 0`, `response_format: text`, ...).

top_p 0 keeps only the most likely token (as OpenAI and vLLM read it: greedy), temperature 0 is greedy.

A server reads a request through `read_request` (JSON, `parse_request`, the model's name) and answers a
refusal with `error_response`; a front that relays to another OpenAI server sends
`ParsedRequest.child_body()`, the request as read, so nothing downstream reads the raw body again. With
`function_calling` (serve api), a chat's tools are written into its messages (`tool_calls.plain_request`) and
`ParsedRequest.tool_calling` says how to read the reply's calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dapo_suite.inference.structured import ResponseFormat
    from dapo_suite.inference.tool_calls import ToolCalling

MAX_CHOICES = 128  # the most choices (`n`) one request may ask for, OpenAI's own limit
BOUNDS = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}
# what a request without max_tokens may generate (and what the prompt limit assumes)
DEFAULT_MAX_TOKENS = 1024
MAX_TOP_LOGPROBS = {True: 20, False: 5}  # chat's top_logprobs, completions' logprobs: OpenAI's limits
ROLES = {"system", "developer", "user", "assistant"}  # developer is OpenAI's newer name for system
# fields that cannot change what is sampled: accepted and ignored
INERT = {
    "model",
    "user",
    "metadata",
    "store",
    "service_tier",
    "stream",
    "stream_options",
    "parallel_tool_calls",
    "prompt_cache_key",
    "safety_identifier",
}
# fields this server does not implement, accepted only with the value that leaves the reply as it is
NEUTRAL = {
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "logit_bias": ({},),
    "tools": ([],),
    "functions": ([],),
    "tool_choice": ("none",),
    "function_call": ("none",),
    "response_format": ({"type": "text"},),
    "best_of": (1,),
    "suffix": ("",),
    "modalities": (["text"],),
}
# continue_final_message / add_generation_prompt: vLLM's extension, to continue an assistant message (a tool's
# output appended to it: the chat's Python tool)
FIELDS = {
    True: {
        "messages",
        "max_completion_tokens",
        "logprobs",
        "top_logprobs",
        "continue_final_message",
        "add_generation_prompt",
    },
    False: {"prompt", "logprobs", "echo"},
}
COMMON = {
    "max_tokens",
    "n",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "ignore_eos",
}  # ignore_eos: vLLM's extension


class RequestFieldError(ValueError):
    """A field of the request is missing, out of range or of the wrong type: HTTP 400 naming `param`."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def continuation(body: dict, messages: list[dict]) -> bool:
    """Whether the request continues its last message (`continue_final_message`, with `add_generation_prompt`
    false or absent, as vLLM takes them); that message must be the assistant's."""
    continue_final = body.get("continue_final_message", False)
    generation_prompt = body.get("add_generation_prompt", not continue_final)
    for name, value in (
        ("continue_final_message", continue_final),
        ("add_generation_prompt", generation_prompt),
    ):
        if not isinstance(value, bool):
            raise RequestFieldError(f"{name} must be true or false", name)
    if continue_final and generation_prompt:
        raise RequestFieldError(
            "continue_final_message needs add_generation_prompt false", "add_generation_prompt"
        )
    if continue_final and messages[-1]["role"] != "assistant":
        raise RequestFieldError(
            "continue_final_message continues the last message, which must be the assistant's", "messages"
        )
    return continue_final


@dataclass(frozen=True)
class SamplingFields:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


@dataclass(frozen=True)
class ParsedRequest:
    """A checked request. `prompts`: the token ids of each prompt (one for chat, the rendered conversation);
    `top_logprobs`: None when no log-probs are asked for, else how many alternatives each token lists."""

    chat: bool
    prompts: list[list[int]]
    max_tokens: int
    sampling: SamplingFields
    stop: list[str] = field(default_factory=list)
    top_logprobs: int | None = None
    echo: bool = False
    # generate max_tokens whatever the model samples (vLLM's field): benchmarks' equal work
    ignore_eos: bool = False
    stream: bool = False
    include_usage: bool = False
    model: str | None = None
    messages: list[dict] | None = None  # chat: the messages as the template read them (text content)
    continue_final: bool = False  # chat: the reply continues the last (assistant) message
    prompt: Any = None  # completions: the prompt as given (text or token ids), checked
    tool_calling: ToolCalling | None = None  # chat with tools: how the reply's calls are read (tool_calls.py)
    response_format: ResponseFormat | None = (
        None  # structured outputs: the grammar of the reply (structured.py)
    )

    def child_body(self, model: str) -> dict:
        """This request as another OpenAI server gets it (serve api's child): the fields as read here,
        OpenAI's defaults filled in, naming the model as that server knows it, always streamed with usage."""
        body: dict[str, Any] = {
            "model": model,
            "max_tokens": self.max_tokens,
            "n": self.sampling.n,
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.sampling.seed is not None:
            body["seed"] = self.sampling.seed
        if self.stop:
            body["stop"] = self.stop
        if self.ignore_eos:
            body["ignore_eos"] = True
        if self.response_format is not None:
            kind, schema = self.response_format
            body["response_format"] = (
                {"type": kind}
                if schema is None
                else {"type": kind, "json_schema": {"name": "reply", "schema": schema}}
            )
        if self.chat:
            body["messages"] = self.messages
            if self.continue_final:
                body |= {"continue_final_message": True, "add_generation_prompt": False}
            if self.top_logprobs is not None:
                body |= {"logprobs": True, "top_logprobs": self.top_logprobs}
        else:
            body["prompt"] = self.prompt
            if self.top_logprobs is not None:
                body["logprobs"] = self.top_logprobs
            if self.echo:
                body["echo"] = True
        return body


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sampling_fields(body: dict) -> SamplingFields:
    """The request's sampling fields with OpenAI's defaults for those absent or null; RequestFieldError
    otherwise."""
    n = 1 if body.get("n") is None else body["n"]
    if not _is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise RequestFieldError(f"n={n!r}: must be an integer from 1 to {MAX_CHOICES}", "n")
    values = {}
    for name, (low, high) in BOUNDS.items():
        value = body.get(name)
        value = 1.0 if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise RequestFieldError(f"{name}={value!r}: must be a number from {low:g} to {high:g}", name)
        values[name] = float(value)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestFieldError(f"seed={seed!r}: must be an integer", "seed")
    return SamplingFields(n=n, seed=seed, **values)


def check_fields(body: dict, chat: bool) -> None:
    """400 for a field this server does not know, unless it cannot change the reply."""
    known = FIELDS[chat] | COMMON | INERT
    for name, value in body.items():
        if name in known or value is None or value in NEUTRAL.get(name, ()):
            continue
        if name in NEUTRAL:
            raise RequestFieldError(
                f"{name}={value!r}: this server does not implement {name}; leave it out", name
            )
        raise RequestFieldError(f"Unrecognized request argument supplied: {name}", name)


def chat_messages(messages: Any) -> list[dict]:
    """`messages` with each content as one string (text parts joined by newlines); RequestFieldError naming
    the first bad message, role or content part."""
    if not isinstance(messages, list) or not messages:
        raise RequestFieldError("messages must be a non-empty list of {role, content} objects", "messages")
    read = []
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            raise RequestFieldError(f"{where} must be an object with role and content", where)
        role = message.get("role")
        if role not in ROLES:
            raise RequestFieldError(
                f"{where}.role={role!r}: must be one of {', '.join(sorted(ROLES))}", f"{where}.role"
            )
        for key in message:
            if key not in ("role", "content", "name"):
                raise RequestFieldError(
                    f"{where}.{key}: this server does not implement {key}", f"{where}.{key}"
                )
        read.append(
            {
                "role": "system" if role == "developer" else role,
                "content": _text(message.get("content"), f"{where}.content"),
            }
        )
    return read


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise RequestFieldError(f"{where} must be a string or a non-empty list of text parts", where)
    texts = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RequestFieldError(
                f"{where}[{index}]: a part of type {kind!r}; this model reads only "
                "{type: text, text: string} parts",
                f"{where}[{index}]",
            )
        texts.append(part["text"])
    return "\n".join(texts)  # as vLLM joins text parts


def prompt_ids(prompt: Any, tokenizer) -> list[list[int]]:
    """The token ids of each prompt of a completions request (a string, a list of strings, a list of token
    ids, or a list of such lists)."""
    vocab = len(tokenizer)

    def one(value: Any) -> list[int]:
        if isinstance(value, str):
            ids = tokenizer(value)["input_ids"]
        elif isinstance(value, list) and all(_is_int(token) for token in value):
            if not all(0 <= token < vocab for token in value):
                raise RequestFieldError(
                    f"prompt holds a token id outside the vocabulary (0-{vocab - 1})", "prompt"
                )
            ids = list(value)
        else:
            raise RequestFieldError(
                "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
                "prompt",
            )
        if not ids:
            raise RequestFieldError("prompt is empty", "prompt")
        return ids

    if isinstance(prompt, list) and prompt and all(isinstance(item, str | list) for item in prompt):
        return [one(item) for item in prompt]
    return [one(prompt)]


def _top_logprobs(body: dict, chat: bool, token_engine: bool) -> int | None:
    """How many alternatives each token's log-prob lists (None: no log-probs asked for)."""
    limit = MAX_TOP_LOGPROBS[chat]
    if chat:
        wanted, top = body.get("logprobs"), body.get("top_logprobs")
        if wanted is not None and not isinstance(wanted, bool):
            raise RequestFieldError(f"logprobs={wanted!r}: must be true or false", "logprobs")
        if top is not None and (not _is_int(top) or not 0 <= top <= limit):
            raise RequestFieldError(
                f"top_logprobs={top!r}: must be an integer from 0 to {limit}", "top_logprobs"
            )
        if top is not None and not wanted:
            raise RequestFieldError("top_logprobs needs logprobs: true", "top_logprobs")
        count, param = (top or 0) if wanted else None, "top_logprobs" if top else "logprobs"
    else:
        count = body.get("logprobs")
        if count is not None and (not _is_int(count) or not 0 <= count <= limit):
            raise RequestFieldError(f"logprobs={count!r}: must be an integer from 0 to {limit}", "logprobs")
        param = "logprobs"
    if count is not None and not token_engine:
        raise RequestFieldError(
            f"{param}: this server's model engine does not give log-probs (start it with "
            "`--engine sampler` or `vllm`)",
            param,
        )
    return count


def parse_request(
    body: Any,
    chat: bool,
    tokenizer,
    context: int,
    max_prompt_tokens: int | None = None,
    token_engine: bool = True,
    function_calling: bool = False,
    structured_outputs: bool = False,
) -> ParsedRequest:
    """`body` of /v1/chat/completions (`chat`) or /v1/completions, checked and tokenized; RequestFieldError
    (400, naming the field) for anything OpenAI would refuse or this server cannot honour. `context`: the
    model's window in tokens; a prompt longer than `max_prompt_tokens` (default: context - max_tokens) is
    refused. `token_engine`: the engine behind the server samples token by token (the sampler, vLLM), so
    log-probs, echo and ignore_eos are there; False for `transformers serve`. `function_calling`: the server
    reads calls out of the reply (serve api), so a chat may carry `tools`, `tool_choice`, assistant
    `tool_calls` and `tool` messages: they are written into the messages (`tool_calls.plain_request`).
    `structured_outputs`: the engine decodes under a grammar (the sampler, vLLM), so `response_format`
    json_object and json_schema are taken (`structured.read_response_format`)."""
    from dapo_suite.core.prompts import render_chat
    from dapo_suite.inference.tool_calls import plain_request

    if not isinstance(body, dict):
        raise RequestFieldError("the request body must be a JSON object", None)
    tool_calling = None
    if chat and function_calling:
        body, tool_calling = plain_request(body)
    response_format = None
    if structured_outputs and body.get("response_format") is not None:
        response_format = _response_format(body["response_format"], tool_calling is not None)
        body = {key: value for key, value in body.items() if key != "response_format"}
    check_fields(body, chat)
    if body.get("model") is not None and not isinstance(body["model"], str):
        raise RequestFieldError(f"model={body['model']!r}: must be a string", "model")
    sampling = sampling_fields(body)
    top_logprobs = _top_logprobs(body, chat, token_engine)
    echo = body.get("echo") is True
    if body.get("echo") not in (None, True, False):
        raise RequestFieldError(f"echo={body['echo']!r}: must be true or false", "echo")
    if echo and not token_engine:
        raise RequestFieldError("echo: this server's model engine does not echo the prompt", "echo")
    ignore_eos = body.get("ignore_eos") is True
    if body.get("ignore_eos") not in (None, True, False):
        raise RequestFieldError(f"ignore_eos={body['ignore_eos']!r}: must be true or false", "ignore_eos")
    if ignore_eos and not token_engine:
        raise RequestFieldError(
            "ignore_eos: this server's model engine does not implement it (start it with "
            "`--engine sampler` or `vllm`)",
            "ignore_eos",
        )

    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = DEFAULT_MAX_TOKENS if body.get(key) is None else body[key]
    lowest = 0 if echo else 1  # echo with max_tokens 0 scores the prompt alone (lm-eval's loglikelihood)
    if not _is_int(max_tokens) or not lowest <= max_tokens < context:
        raise RequestFieldError(
            f"{key}={max_tokens!r}: must be an integer from {lowest} to {context - 1} (the "
            f"model's context is {context} tokens)",
            key,
        )

    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or len(stops) > 4 or not all(isinstance(item, str) for item in stops):
        raise RequestFieldError("stop must be a string or a list of at most 4 strings", "stop")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise RequestFieldError("stream_options must be an object", "stream_options")

    messages, continue_final = None, False
    if chat:
        if "messages" not in body:
            raise RequestFieldError("the request has no messages", "messages")
        messages = chat_messages(body["messages"])
        continue_final = continuation(body, messages)
        try:
            prompts = [
                tokenizer(render_chat(tokenizer, messages, continue_final), add_special_tokens=False)[
                    "input_ids"
                ]
            ]
        except Exception as error:  # noqa: BLE001 - a chat template refuses a conversation by raising (jinja's raise_exception)
            raise RequestFieldError(
                f"the model's chat template refuses these messages: {error}", "messages"
            ) from None
    else:
        if "prompt" not in body:
            raise RequestFieldError("the request has no prompt", "prompt")
        prompts = prompt_ids(body["prompt"], tokenizer)
    field_name = "messages" if chat else "prompt"
    limit = max_prompt_tokens or context - max_tokens
    longest = max(len(ids) for ids in prompts)
    if longest > limit:
        raise RequestFieldError(
            f"the prompt is {longest} tokens; this server takes at most {limit} (context "
            f"{context} - {key} {max_tokens}). Shorten the prompt or lower {key}.",
            field_name,
        )
    return ParsedRequest(
        chat=chat,
        prompts=prompts,
        max_tokens=max_tokens,
        sampling=sampling,
        stop=stops,
        top_logprobs=top_logprobs,
        echo=echo,
        ignore_eos=ignore_eos,
        stream=bool(body.get("stream")),
        include_usage=bool((options or {}).get("include_usage")),
        model=body.get("model"),
        messages=messages,
        continue_final=continue_final,
        prompt=None if chat else body["prompt"],
        tool_calling=tool_calling,
        response_format=response_format,
    )


def _response_format(value: Any, with_tools: bool):
    from dapo_suite.inference.structured import read_response_format

    try:
        read = read_response_format(value)
    except ValueError as error:
        raise RequestFieldError(str(error), "response_format") from None
    if read is not None and with_tools:
        raise RequestFieldError(
            "response_format json_* cannot be combined with tools: leave one out", "response_format"
        )
    return read


def error_response(status: int, message: str, param: str | None = None, code: str | None = None):
    """An OpenAI-shaped client error (`{"error": {"message", "type", "param", "code"}}`) with its HTTP status,
    the same from every server of the project."""
    from starlette.responses import JSONResponse

    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}},
        status_code=status,
    )


def model_not_found(model: str | None, names: tuple[str, ...]):
    """404 `model_not_found` for a request naming another model than `names` (the served name, then its path);
    None when it names one of them or none."""
    if model is None or model in names:
        return None
    return error_response(
        404,
        f"The model `{model}` does not exist: this server serves `{names[0]}` (GET /v1/models)",
        "model",
        "model_not_found",
    )


async def read_request(request, names: tuple[str, ...], parse: Callable[[Any, bool], ParsedRequest]):
    """The starlette `request` to /v1/chat/completions or /v1/completions, read once: its JSON body checked by
    `parse(body, chat)` (a `parse_request` with the server's limits; in a thread, as a chat template takes a
    while to render) and its model against `names`. Returns the `ParsedRequest`, or the error response to send
    (400 naming the field, 404 for another model)."""
    chat = request.url.path.endswith("/chat/completions")
    try:
        body = await request.json()
    except ValueError:
        return error_response(400, "the request body is not JSON")
    try:
        parsed = await asyncio.to_thread(parse, body, chat)
    except RequestFieldError as error:
        return error_response(400, str(error), error.param)
    missing = model_not_found(parsed.model, names)
    return parsed if missing is None else missing


def openai_routes(health: Callable, models: Callable, generate: Callable) -> list:
    """The paths an OpenAI-compatible server answers, as vLLM's: /health, /v1/models, and `generate` for both
    chat and legacy completions (POST). Starlette `Route`s."""
    from starlette.routing import Route

    return [
        Route("/health", health),
        Route("/v1/models", models),
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
    ]
