"""The browser chat (Gradio 6): streams a reasoner's reply from an OpenAI-compatible endpoint, folds the
reasoning into a collapsible "Thinking" message and shows the final `Answer:` line with a badge when it is an
integer, and checks the answer when the question is a known AIME 2024 problem. All inference goes through
`openai` to one endpoint (`dapo_suite.inference.endpoint`), so the app is the same on a laptop (dapo-suite's
batched sampler) and on a GPU (`vllm serve`).

Limits: a queue with a concurrency limit and a maximum size, a maximum question length, a timeout per reply,
and no file routes beyond Gradio's own static assets (no `allowed_paths`)."""

from __future__ import annotations

import contextlib
import html
import os
import re
import signal
import time
from collections.abc import Iterator

from dapo_suite.core.problems import Problem
from dapo_suite.core.prompts import TOOL_INSTRUCTIONS, format_prompt
from dapo_suite.core.sandbox import RunResult
from dapo_suite.inference.endpoint import (
    Endpoint,
    EndpointError,
    connect_endpoint,
    start_endpoint,
    stream_errors,
)
from dapo_suite.inference.tool_loop import last_code_block, tool_turn_text
from serve.auth import read_logins
from serve.chat import Speed, check, find_problem, load_examples, split_reply
from serve.config import ServeConfig

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")  # no phoning home from a local model server

# gradio_client: Client(url).submit(question, temperature, top_p, max_tokens, dapo, api_name="/chat")
API_NAME = "chat"
THINKING = "Thinking"
TOOL_TITLE = "Ran Python"
UPDATE_INTERVAL_S = 0.1
_ANSWER_MESSAGE = re.compile(r"^\*\*Answer:\*\* (.*)$", re.MULTILINE)

CSS = """
.badge { display: inline-block; padding: 1px 9px; margin-right: 6px; border-radius: 999px; font-size: 0.8em;
         font-weight: 600; line-height: 1.6; }
.badge-integer { background: #e0e7ff; color: #3730a3; }
.badge-correct { background: #dcfce7; color: #166534; }
.badge-wrong { background: #fee2e2; color: #991b1b; }
.badge-none { background: #f3f4f6; color: #4b5563; }
.reply-stats { color: #6b7280; font-size: 0.85em; }
footer { display: none !important; }
"""


def _text(content) -> str:
    """Gradio history content: a string, or a list of {"type": "text", "text": ...} parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def history_to_messages(history: list[dict], dapo_prompt: bool, tools: bool = False) -> list[dict[str, str]]:
    """Chat history as the model saw it: user turns (wrapped as they were sent), assistant turns rebuilt from
    the Thinking message (which holds the code blocks and their outputs) plus the `Answer:` line; tool calls
    shown apart, badges, checks, speed lines and warnings are left out."""
    messages: list[dict[str, str]] = []
    for entry in history:
        role, content = entry.get("role"), _text(entry.get("content"))
        if role == "user":
            messages.append({"role": "user", "content": user_message(content, dapo_prompt, tools)})
            continue
        if role != "assistant":
            continue
        if (entry.get("metadata") or {}).get("title") == THINKING:
            part = content
        elif match := _ANSWER_MESSAGE.search(content):
            part = f"Answer: {match[1]}"
        else:
            continue
        if messages and messages[-1]["role"] == "assistant":
            messages[-1]["content"] += "\n\n" + part
        else:
            messages.append({"role": "assistant", "content": part})
    return messages


def user_message(question: str, dapo_prompt: bool, tools: bool) -> str:
    """A question as it is sent: in the DAPO prompt or as typed, with the tool's instruction when it is on."""
    return (format_prompt(question) if dapo_prompt else question) + (TOOL_INSTRUCTIONS if tools else "")


def tool_message(code: str, result: RunResult):
    """One call, folded as Thinking is: its code and what the model was shown."""
    import gradio as gr

    title = TOOL_TITLE + ("" if result.outcome == "ok" else f": {result.outcome.replace('_', ' ')}")
    body = f"```python\n{code.rstrip()}\n```\n```\n{result.model_view(2000) or '(no output)'}\n```"
    return gr.ChatMessage(
        role="assistant",
        content=body,
        metadata={"title": title, "status": "done", "duration": round(result.execution_time, 2)},
    )


def _shorten(text: str, limit: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def balance_math(text: str) -> str:
    """Escape a trailing unmatched `$` (a partial reply, or a model that never closes it), which would
    otherwise make the Markdown renderer swallow the rest of the message as broken LaTeX."""
    unescaped = [m.start() for m in re.finditer(r"(?<!\\)\$", text)]
    if len(unescaped) % 2 == 1:
        cut = unescaped[-1]
        text = text[:cut] + "\\$" + text[cut + 1 :]
    return text


def render(
    text: str, speed: Speed, done: bool, problem: Problem | None, note: str | None = None, calls: tuple = ()
):
    """The assistant messages for a (partial) reply: Thinking, each tool call (`calls`: (code, RunResult)),
    then the answer with its badges and figures."""
    import gradio as gr

    reply = split_reply(text)
    # Live figures while streaming; once done, the answer message carries them and the title its duration.
    thinking_meta = (
        {"title": THINKING, "status": "done", "duration": round(speed.elapsed_s, 1)}
        if done
        else {"title": THINKING, "status": "pending", "log": str(speed)}
    )
    messages = [
        gr.ChatMessage(role="assistant", content=balance_math(reply.thinking) or "…", metadata=thinking_meta),
        *(tool_message(code, result) for code, result in calls),
    ]
    if not done and reply.answer is None:
        return messages
    lines = []
    if reply.answer is not None:
        lines.append(f"**Answer:** {reply.answer}")
    else:
        lines.append("No `Answer:` line in this reply.")
    badges = []
    if reply.integer is not None:
        badges.append(f'<span class="badge badge-integer">integer {reply.integer}</span>')
    if done and problem is not None:
        if check(text, problem):
            badges.append(
                f'<span class="badge badge-correct">✓ correct: AIME {html.escape(problem.id)}</span>'
            )
        else:
            badges.append(
                f'<span class="badge badge-wrong">✗ AIME {html.escape(problem.id)} answer is '
                f"{html.escape(problem.answer)}</span>"
            )
    if badges:
        lines.append(" ".join(badges))
    if done:
        lines.append(f'<span class="reply-stats">{speed}</span>')
    if note:
        lines.append(f"⚠️ {note}")
    messages.append(gr.ChatMessage(role="assistant", content="\n\n".join(lines)))
    return messages


def build_app(config: ServeConfig, endpoint: Endpoint):
    """The Gradio Blocks app for one endpoint (not launched: `launch_app` or a test launches it)."""
    import gradio as gr
    import openai

    client = openai.OpenAI(
        base_url=endpoint.base_url,
        api_key=os.environ.get("OPENAI_API_KEY", "unused"),
        timeout=openai.Timeout(config.request_timeout_s, connect=10.0),
        max_retries=0,
    )
    problems = load_examples("aime24")

    sandbox = None
    if config.tools:
        from dapo_suite.core.sandbox import Sandbox
        from dapo_suite.core.sandbox.tool_config import sandbox_limits

        sandbox = Sandbox(sandbox_limits(None))  # refuses, saying what to install, where it cannot isolate

    def respond(
        message: str,
        history: list[dict],
        temperature: float,
        top_p: float,
        max_tokens: float,
        dapo_prompt: bool,
    ) -> Iterator[list]:
        if not message or not message.strip():
            raise gr.Error("Type a question first.")
        if len(message) > config.max_prompt_chars:
            raise gr.Error(
                f"Your question has {len(message):,} characters; the limit is {config.max_prompt_chars:,}. "
                f"Shorten it, or restart with --max-prompt-chars."
            )
        problem = find_problem(message, problems)
        messages = history_to_messages(history, dapo_prompt, bool(sandbox))
        messages.append({"role": "user", "content": user_message(message, dapo_prompt, bool(sandbox))})
        start = time.perf_counter()
        text, tokens, first_token_s, finish, note, last_update = "", 0, None, None, None, 0.0
        calls: list[tuple[str, RunResult]] = []
        while True:  # one model turn a pass; with the tool, a finished code block ends the turn and runs
            # A later turn continues the assistant's message, the tool's output appended (vLLM's extension).
            turn = messages + [{"role": "assistant", "content": text}] if text else messages
            extra = {"continue_final_message": True, "add_generation_prompt": False} if text else None
            try:
                stream = client.chat.completions.create(
                    model=endpoint.model_name,
                    messages=turn,
                    stream=True,
                    temperature=float(temperature),
                    top_p=float(top_p),
                    max_tokens=max(int(max_tokens) - tokens, 1),
                    stream_options={"include_usage": True},
                    extra_body=extra,
                )
            except (openai.APIConnectionError, openai.APITimeoutError) as error:
                raise gr.Error(f"{endpoint.diagnose()} ({type(error).__name__})") from error
            except openai.APIStatusError as error:
                raise gr.Error(
                    f"The model server refused the request ({error.status_code}): {error.message}"
                ) from error
            turn_start, turn_tokens, code = len(text), 0, None
            try:
                for chunk in stream:
                    if chunk.usage is not None and chunk.usage.completion_tokens:
                        turn_tokens = chunk.usage.completion_tokens  # exact count when the server reports it
                    first_text = first_token_s is None
                    for choice in chunk.choices:
                        if choice.delta.content:
                            text += choice.delta.content
                            turn_tokens += 1
                            first_token_s = first_token_s or time.perf_counter() - start
                            if sandbox and "`" in choice.delta.content:
                                code = last_code_block(text[turn_start:])
                        finish = choice.finish_reason or finish
                    first_text = first_text and first_token_s is not None  # show the first token at once
                    now = time.perf_counter()
                    if now - start > config.request_timeout_s:
                        note = f"Stopped after {config.request_timeout_s:.0f} s (the per-reply timeout)."
                        break
                    if code is not None:
                        break  # the block is complete: stop this turn (closing the stream stops the server)
                    # Coalesce fast streams (a GPU's hundreds of tokens/s) into ~10 UI updates/s: each update
                    # is a diff, a JSON message and a re-render, CPU taken from a model server on the same
                    # machine.
                    if first_text or now - last_update >= UPDATE_INTERVAL_S:
                        last_update = now
                        yield render(
                            text,
                            Speed(tokens + turn_tokens, now - start, first_token_s),
                            False,
                            problem,
                            calls=tuple(calls),
                        )
            except stream_errors() as error:
                note = f"The reply was cut off: {endpoint.diagnose()} ({type(error).__name__})"
            finally:
                # on Stop too (GeneratorExit): the server sees the disconnect and stops generating
                stream.close()
            tokens += turn_tokens
            if (
                code is None
                or note is not None
                or len(calls) >= config.max_tool_calls
                or tokens >= max_tokens
            ):
                break
            result = sandbox.run(code)
            calls.append((code, result))
            text += tool_turn_text(result.model_view(256), text.endswith("\n"))
            finish = None
            yield render(
                text,
                Speed(tokens, time.perf_counter() - start, first_token_s),
                False,
                problem,
                calls=tuple(calls),
            )
        if finish == "length" and note is None:
            note = f"Reached the max-tokens budget ({int(max_tokens)}); raise it for longer reasoning."
        yield render(
            text, Speed(tokens, time.perf_counter() - start, first_token_s), True, problem, note, tuple(calls)
        )

    examples = sorted(problems, key=lambda problem: len(problem.problem))[:4]
    description = (
        f"Model `{endpoint.model_name}` served by `{endpoint.engine}` at `{endpoint.base_url}`. "
        "The reply's reasoning folds into *Thinking*; the final `Answer:` line is graded as DAPO's "
        "reward grades it, and checked when the question is an AIME 2024 problem."
    )
    with gr.Blocks(title="DAPO reasoner", analytics_enabled=False, fill_height=True) as demo:
        # The controls come first so that ChatInterface finds them rendered and leaves them in the sidebar.
        with gr.Sidebar(position="right", open=True, width=300):
            gr.Markdown("### Sampling\nPreset to DAPO's evaluation settings: temperature 1.0, top-p 0.7.")
            temperature = gr.Slider(0.0, 2.0, value=config.temperature, step=0.05, label="Temperature")
            top_p = gr.Slider(0.05, 1.0, value=config.top_p, step=0.05, label="Top-p")
            max_tokens = gr.Slider(
                16, config.max_tokens_limit, value=config.max_tokens, step=16, label="Max tokens"
            )
            dapo_prompt = gr.Checkbox(
                value=config.dapo_prompt,
                label="DAPO prompt",
                info="Wrap the question in the DAPO-Math-17K instruction.",
            )
            gr.Markdown(
                f"<small>Up to {config.concurrency_limit} replies at once; questions up to "
                f"{config.max_prompt_chars:,} characters; replies cut off after "
                f"{config.request_timeout_s:.0f} s.</small>"
            )
        gr.Markdown(f"## DAPO reasoner chat\n{description}")
        chatbot = gr.Chatbot(
            label="Chat",
            elem_id="chat",
            layout="bubble",
            height=600,
            buttons=["copy"],
            render=False,
            latex_delimiters=[
                {"left": "$$", "right": "$$", "display": True},
                {"left": "$", "right": "$", "display": False},
            ],
            placeholder="**Ask a math question**, or start from an AIME 2024 problem:",
        )
        textbox = gr.Textbox(
            placeholder="Ask a math question…",
            show_label=False,
            elem_id="question",
            max_lines=8,
            submit_btn=True,
            stop_btn=True,
            render=False,
        )
        gr.ChatInterface(
            respond,
            chatbot=chatbot,
            textbox=textbox,
            additional_inputs=[temperature, top_p, max_tokens, dapo_prompt],
            # Plain strings (not rows with the sliders' values) so the examples show as cards in the chat.
            examples=[[p.problem] for p in examples] or None,
            example_labels=[f"AIME {p.id}: {_shorten(p.problem)}" for p in examples] or None,
            run_examples_on_click=False,
            cache_examples=False,
            api_name=API_NAME,
            fill_height=True,
            flagging_mode="never",
        )
    return demo


@contextlib.contextmanager
def open_endpoint(config: ServeConfig) -> Iterator[Endpoint]:
    """The endpoint the app talks to: the one at --endpoint, or a model server started for --model."""
    if config.endpoint:
        yield connect_endpoint(config.endpoint, config.model)
        return
    with start_endpoint(
        config.model, port=config.api_port, engine=config.engine, startup_timeout_s=config.startup_timeout_s
    ) as endpoint:
        yield endpoint


def launch_kwargs(config: ServeConfig) -> dict:
    import gradio as gr

    logins = read_logins(config.auth, config.auth_file)
    return dict(
        server_name=config.host,
        server_port=config.port,
        show_error=True,
        ssr_mode=False,
        auth=logins or None,
        auth_message="Log in to chat with the model." if logins else None,
        mcp_server=False,
        max_file_size="1mb",
        footer_links=[],
        css=CSS,
        theme=gr.themes.Soft(
            primary_hue="indigo",
            neutral_hue="slate",
            # System fonts: Gradio's default Google fonts would stall an offline page.
            font=["ui-sans-serif", "system-ui", "sans-serif"],
            font_mono=["ui-monospace", "Consolas", "monospace"],
        ),
    )


def stop_on_sigterm() -> None:
    """Turn SIGTERM into Ctrl-C, so `docker stop` / `kill` unwind the same path and stop the model server."""

    def handler(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def launch_app(config: ServeConfig) -> None:
    """Start (or reach) the endpoint, health-check it, and block in the chat app until Ctrl-C or SIGTERM."""
    stop_on_sigterm()
    try:
        with open_endpoint(config) as endpoint:
            print(
                f"Model server: {endpoint.base_url} (model {endpoint.model_name}, {endpoint.engine})",
                flush=True,
            )
            demo = build_app(config, endpoint)
            demo.queue(default_concurrency_limit=config.concurrency_limit, max_size=config.max_queue)
            demo.launch(**launch_kwargs(config))
    except KeyboardInterrupt:
        pass
    except EndpointError as error:
        raise SystemExit(f"dapo-suite serve: {error}") from None
