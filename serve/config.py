"""The serving stage's one config: where the model comes from, how it samples, and the limits that keep the
app up. `dapo-suite serve` fills it from `--config FILE.yaml`, then the flags given
(`dapo_suite.core.fields.load_config`); `__post_init__` rejects impossible values and says what to set."""

from __future__ import annotations

from dataclasses import dataclass

from serve.auth import read_logins

ENGINES = ("auto", "vllm", "sampler", "transformers")


@dataclass
class ServeConfig:
    model: str | None = None
    """A checkpoint directory (`dapo-suite train` output), a hub id, or None for the embedded SmolLM2-135M.
    With `endpoint`, the served model name to request (None: the first id that /v1/models lists)."""
    endpoint: str | None = None
    """Base URL of a running OpenAI-compatible server (`.../v1`); when set, no model server is started."""
    engine: str = "auto"
    """Which server `--model` starts: `vllm serve` when vLLM and a GPU are present (auto), else dapo-suite's
    batched sampler (`sampler`); `transformers serve` when asked for."""
    host: str = "127.0.0.1"
    """Address the chat app binds: loopback only unless you choose otherwise."""
    port: int = 7860
    auth: str | None = None
    """`user:password` the chat asks for before it opens (Gradio's login page); None with no auth_file: no
    login."""
    auth_file: str | None = None
    """A file of `user:password` lines, one login each (blank lines and # comments skipped)."""
    api_port: int | None = None
    """Port of the model server started for `--model` (None: a free one)."""

    # Sampling: DAPO's evaluation settings (paper sec. 4.1: temperature 1.0, top-p 0.7).
    temperature: float = 1.0
    top_p: float = 0.7
    max_tokens: int = 512
    """Default reply budget: room for a worked answer and its `Answer:` line, short enough to wait for on a
    CPU."""
    max_tokens_limit: int = 8192
    """Upper end of the max-tokens slider (SmolLM2's context is 8192)."""
    dapo_prompt: bool = True
    """Wrap each question in the DAPO-Math-17K instruction (it asks for a final `Answer:` line)."""
    tools: str | None = None
    """"python": the model may run
    ```python blocks in the sandbox (docs/tools.md); each call and its output are shown folded, as Thinking
    is."""
    max_tool_calls: int = 3
    """Code blocks run per reply (verl's max_assistant_turns - 1); a later block ends the reply."""

    # Limits that keep a shared app responsive.
    concurrency_limit: int = 2
    """Replies generated at once; further requests wait in the queue."""
    max_queue: int = 32
    """Requests that may wait; beyond that the app answers "queue full" instead of piling up."""
    max_prompt_chars: int = 6000
    """Longest question accepted (AIME problems are under 1,000 characters)."""
    request_timeout_s: float = 300.0
    """A reply that streams longer than this (or a server silent this long) is cut off with a message."""
    startup_timeout_s: float = 600.0
    """How long the model server may take to become healthy (generous: vLLM compiles its graphs first)."""

    def __post_init__(self) -> None:
        if self.tools not in (None, "python"):
            raise ValueError(f"tools={self.tools!r}: the tools are python.")
        if self.engine not in ENGINES:
            raise ValueError(f"engine={self.engine!r}: choose one of {', '.join(ENGINES)}.")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(
                f"temperature={self.temperature}: set a value in [0, 2] (DAPO evaluates at 1.0)."
            )
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p}: set a value in (0, 1] (DAPO evaluates at 0.7).")
        if not 1 <= self.max_tokens <= self.max_tokens_limit:
            raise ValueError(f"max_tokens={self.max_tokens}: set a value in [1, {self.max_tokens_limit}].")
        for name in ("concurrency_limit", "max_queue", "max_prompt_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: set a positive value.")
        if self.request_timeout_s <= 0 or self.startup_timeout_s <= 0:
            raise ValueError("request_timeout_s and startup_timeout_s must be positive numbers of seconds.")
        read_logins(self.auth, self.auth_file)  # a malformed login is refused here, naming its flag or line
        if self.endpoint is not None and not self.endpoint.startswith(("http://", "https://")):
            raise ValueError(f"endpoint={self.endpoint!r}: pass a base URL such as http://127.0.0.1:8000/v1.")
