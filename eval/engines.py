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
        self.api_key = api_key
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
    if config.tools:
        from dapo_suite.core.sandbox import Sandbox
        from dapo_suite.core.sandbox.tool_config import sandbox_limits
        from dapo_suite.inference.tool_loop import ToolEngine

        return ToolEngine(
            HFEngine.load(config.model, engine_dtype(config), config.batch_size),
            Sandbox(sandbox_limits(None)),
        )
    if engine == "openai":
        return OpenAIEngine(
            config.endpoint, config.model, config.concurrency, config.max_retries, config.request_timeout
        )
    if engine == "vllm":
        return VLLMEngine.load(config.model, engine_dtype(config), config.seed)
    return HFEngine.load(config.model, engine_dtype(config), config.batch_size)
