"""Eval's engines: the sampling engines of `dapo_suite.inference.engines` (hf, vllm) loaded by model name, and
`OpenAIEngine`, the same protocol (`generate(requests, sampling, emit)`) against any OpenAI-compatible server
(`vllm serve`, `transformers serve`): asyncio with a concurrency limit and retries with exponential backoff.
`make_engine` builds the one `EvalConfig` names. No engine holds grading or metric code.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence

from tqdm.auto import tqdm

from dapo_suite.core.errors import UserError
from dapo_suite.inference.engines import Completion, Emit, Engine, HFEngine, Request, Sampling, VLLMEngine

RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEngine:
    """An OpenAI-compatible endpoint: chat completions (completions with chat_template=False)."""

    name = "openai"

    def __init__(
        self,
        endpoint: str,
        model: str | None = None,
        concurrency: int = 64,
        max_retries: int = 6,
        timeout: float = 3600.0,
        backoff: float = 1.0,
        api_key: str = "EMPTY",
        tools: EndpointTools | None = None,
    ):
        from dapo_suite.inference.endpoint import connect_endpoint

        # One place normalises the URL and asks /v1/models for the name when --model is not given.
        served = connect_endpoint(endpoint, model)
        self.base_url, self.model = served.base_url, served.model_name
        self.concurrency, self.max_retries, self.timeout, self.backoff = (
            concurrency,
            max_retries,
            timeout,
            backoff,
        )
        self.api_key, self.tools = api_key, tools
        import openai  # imported here, not inside the timed generation: its import is slow

        self.openai = openai

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        asyncio.run(self._generate_all(requests, sampling, emit))

    async def _generate_all(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        client = self.openai.AsyncOpenAI(
            base_url=self.base_url, api_key=self.api_key, max_retries=0, timeout=self.timeout
        )
        limit = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.ensure_future(self._one(client, limit, r, sampling)) for r in requests]
        emitted: set[tuple[str, int]] = set()
        try:
            with tqdm(total=len(tasks), desc="generate (openai)", unit="sample") as bar:
                for finished in asyncio.as_completed(tasks):
                    completion = await finished
                    emit(completion)
                    emitted.add((completion.problem_id, completion.sample_index))
                    bar.update(1)
        except Exception:
            # Giving up on one request: every sample that did finish still reaches disk, so a rerun resumes.
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is None:
                    completion = task.result()
                    if (completion.problem_id, completion.sample_index) not in emitted:
                        emit(completion)
            raise
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await client.close()

    async def _one(
        self, client, limit: asyncio.Semaphore, request: Request, sampling: Sampling
    ) -> Completion:
        """One sample, retried with exponential backoff on connection faults, timeouts, retryable statuses and
        malformed responses (a body that is not JSON, or no choices)."""
        openai = self.openai
        common = {
            "model": self.model,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens,
            "seed": request.seed,
        }
        attempt = 0
        while True:
            try:
                async with limit:
                    if self.tools is not None:
                        return await self.tools.trajectory(client, request, sampling, common)
                    if sampling.chat_template:
                        response = await client.chat.completions.create(
                            messages=[{"role": "user", "content": request.prompt}], **common
                        )
                    else:
                        response = await client.completions.create(prompt=request.prompt, **common)
                choice = response.choices[0]
                text = (choice.message.content if sampling.chat_template else choice.text) or ""
                tokens = response.usage.completion_tokens if response.usage else 0
                return Completion(
                    request.problem_id,
                    request.sample_index,
                    text,
                    "length" if choice.finish_reason == "length" else "stop",
                    tokens,
                )
            except (
                openai.APIConnectionError,
                openai.APITimeoutError,
                openai.APIStatusError,
                openai.APIResponseValidationError,
                ValueError,
                TypeError,
                AttributeError,
                IndexError,
            ) as error:
                status = getattr(error, "status_code", None)
                if (status is not None and status not in RETRYABLE_STATUS) or attempt == self.max_retries:
                    kind = f"HTTP {status}" if status is not None else type(error).__name__
                    raise UserError(
                        f"--endpoint {self.base_url}: the request for sample {request.sample_index} of "
                        f"problem {request.problem_id} (model {self.model}) failed after {attempt + 1} "
                        f"attempt(s): {kind}: "
                        f"{str(error).splitlines()[0] if str(error) else '(no message)'}. Finished samples "
                        f"are on disk: rerun the same command to resume."
                    ) from error
            await asyncio.sleep(min(self.backoff * 2**attempt, 60.0) * (0.5 + random.random()))
            attempt += 1


class EndpointTools:
    """The tool loop of `dapo_suite.inference.tool_loop.ToolEngine` on the client side of an endpoint: each
    model turn is a streamed chat completion, cut where the turn ends in a complete ```python block (the same
    rule, `last_code_block`); the block runs in the sandbox here, and its ```output block is appended to the
    assistant message, which the next turn continues (`continue_final_message`, vLLM's extension, which
    `serve api` takes too). The response budget counts model and tool tokens together, as the embedded loop's
    does: the model's by the tokens the server streamed (one log-prob each), the tool's by `tokenizer`."""

    def __init__(self, sandbox, settings, tokenizer) -> None:
        self.sandbox, self.settings, self.tokenizer = sandbox, settings, tokenizer

    async def trajectory(self, client, request: Request, sampling: Sampling, common: dict) -> Completion:
        import torch

        from dapo_suite.inference.tool_loop import ToolCall, last_code_block, tool_turn_text

        pieces: list[tuple[str, int, bool]] = []  # (text, tokens, the model's own)
        calls: list[ToolCall] = []
        finish = "stop"
        for turn in range(1, self.settings.max_assistant_turns + 1):
            room = sampling.max_tokens - sum(tokens for _, tokens, _ in pieces)
            text, tokens, finish = await self._turn(client, request, pieces, {**common, "max_tokens": room})
            pieces.append((text, tokens, True))
            if finish != "tool" or turn == self.settings.max_assistant_turns:
                finish = "length" if finish == "length" else "stop"  # a block in the last turn is not run
                break
            code = last_code_block(text)
            result = await asyncio.to_thread(self.sandbox.run, code)
            shown = result.model_view(
                self.settings.max_tool_response_length, self.settings.tool_response_truncate_side
            )
            ids = self.tokenizer(tool_turn_text(shown, text.endswith("\n")), add_special_tokens=False)
            room -= tokens
            kept = ids["input_ids"][:room]
            pieces.append((self.tokenizer.decode(kept), len(kept), False))
            calls.append(ToolCall(code, result.outcome, shown, len(kept), result.execution_time))
            if len(ids["input_ids"]) >= room:  # the budget ends inside the tool's turn
                finish = "length"
                break
        mask = torch.cat([torch.full((tokens,), 1.0 if own else 0.0) for _, tokens, own in pieces])
        return Completion(
            request.problem_id,
            request.sample_index,
            "".join(text for text, _, _ in pieces),
            finish,
            int(mask.numel()),
            response_mask=mask,
            tool_calls=tuple(calls),
            model_text="".join(text for text, _, own in pieces if own),
        )

    async def _turn(self, client, request: Request, pieces, common: dict) -> tuple[str, int, str]:
        """One model turn: (its text, its tokens, "tool" when it ends in a code block, else the finish
        reason)."""
        from dapo_suite.inference.tool_loop import last_code_block

        messages = [{"role": "user", "content": request.prompt}]
        extra = {}
        if pieces:
            messages.append({"role": "assistant", "content": "".join(text for text, _, _ in pieces)})
            extra = {"continue_final_message": True, "add_generation_prompt": False}
        stream = await client.chat.completions.create(
            messages=messages, stream=True, logprobs=True, extra_body=extra, **common
        )
        text, tokens, finish = "", 0, "stop"
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            delta = choice.delta.content or ""
            text += delta
            streamed = choice.logprobs.content if choice.logprobs else None
            tokens += len(streamed) if streamed else 0
            if "`" in delta and last_code_block(text) is not None:
                await stream.close()  # the turn ends at its block, as the embedded loop's stop rule ends it
                return text, tokens or self._count(text), "tool"
            if choice.finish_reason:
                finish = "length" if choice.finish_reason == "length" else "stop"
        return text, tokens or self._count(text), finish

    def _count(self, text: str) -> int:
        """Tokens of `text` by the tokenizer, for a server that streams no log-probs."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])


def endpoint_tools(model: str | None, served: str):
    """The client-side tool loop for the served model: the sandbox with the shipped tool's limits, and the
    tokenizer of `--model` (a local folder, a hub id, or the embedded model by its served name)."""
    from transformers import AutoTokenizer

    from dapo_suite.core.sandbox import Sandbox
    from dapo_suite.core.sandbox.tool_config import sandbox_limits
    from dapo_suite.inference.models import EMBEDDED_NAME, resolve_model
    from dapo_suite.inference.tool_loop import ToolSettings

    name = model or served
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(None if name == EMBEDDED_NAME else name))
    except (OSError, ValueError) as error:
        raise UserError(
            f"--tools python over --endpoint counts the tool's tokens with the model's tokenizer, and "
            f"{name!r} has none here ({error}); pass --model as the served model's folder or hub id."
        ) from None
    return EndpointTools(Sandbox(sandbox_limits(None)), ToolSettings(), tokenizer)


def engine_name(config) -> str:
    """The engine `config.engine` names; `auto` = openai with an endpoint, vllm on a GPU with vllm, else
    hf."""
    from dapo_suite.inference.models import choose_engine

    return "openai" if config.engine == "auto" and config.endpoint else choose_engine(config.engine)


def engine_dtype(config) -> str:
    """`config.dtype` as the engine will load weights: "auto" -> bfloat16 for vLLM, and for hf where bf16 is
    native on the device it runs on (`dapo_suite.inference.models.resolve_precision`), else float32."""
    if config.dtype != "auto":
        return config.dtype
    if engine_name(config) == "vllm":
        return "bfloat16"
    import torch

    from dapo_suite.inference.models import resolve_precision

    return resolve_precision("auto", "cuda" if torch.cuda.is_available() else "cpu") or "float32"


def make_engine(config) -> Engine:
    """The engine `config` names (`engine_name`), loading weights in `engine_dtype(config)`."""
    engine = engine_name(config)
    if engine == "openai":
        engine = OpenAIEngine(
            config.endpoint, config.model, config.concurrency, config.max_retries, config.request_timeout
        )
        if config.tools:
            engine.tools = endpoint_tools(config.model, engine.model)
        return engine
    if config.tools:
        from dapo_suite.core.sandbox import Sandbox
        from dapo_suite.core.sandbox.tool_config import sandbox_limits
        from dapo_suite.inference.tool_loop import ToolEngine

        return ToolEngine(
            HFEngine.load(config.model, engine_dtype(config), config.batch_size),
            Sandbox(sandbox_limits(None)),
        )
    if engine == "vllm":
        return VLLMEngine.load(config.model, engine_dtype(config), config.seed)
    return HFEngine.load(config.model, engine_dtype(config), config.batch_size)
