"""Generation engines behind one protocol: `engine.generate(requests, sampling, emit)` calls `emit(Completion)`
for every request as soon as it is done, so the runner can append it to disk (resume after a kill).

- `HFEngine`: `sampling.sample_tokens`, batched (prompts sorted by length to limit padding), KV-cached, the
  samples of a problem sharing its prompt's cache;
  the CPU default, embedded model by default.
- `VLLMEngine`: vLLM offline `LLM.generate` (GPU), one seed per sample, so reruns are bit-reproducible.
- `OpenAIEngine`: any OpenAI-compatible server (`vllm serve`, `transformers serve`), asyncio with a
  concurrency limit and retries with exponential backoff.
Each imports its heavy dependency only when built. No engine holds grading or metric code.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from tqdm.auto import tqdm

from dapo_suite.errors import UserError
from dapo_suite.prompts import render_chat


@dataclass(frozen=True)
class Request:
    problem_id: str
    sample_index: int
    prompt: str  # the user message (template already applied)
    seed: int  # per-sample seed (vllm, openai); the hf engine seeds per batch


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    chat_template: bool = True


@dataclass(frozen=True)
class Completion:
    problem_id: str
    sample_index: int
    text: str
    finish_reason: str  # "stop" (end of sequence) or "length" (hit max_tokens)
    num_tokens: int  # generated tokens, end-of-sequence token included


Emit = Callable[[Completion], None]


class Engine(Protocol):
    name: str

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None: ...


def _chunks(items: Sequence, size: int):
    for start in range(0, len(items), size):
        yield items[start : start + size]


class HFEngine:
    """Hugging Face transformers; `model` is a directory, a hub id or None (the embedded model)."""

    name = "hf"

    def __init__(self, model: str | None = None, dtype: str = "float32", batch_size: int = 64, seed: int = 0,
                 device: str | None = None):
        from dapo_suite.models import load_model_and_tokenizer

        self.model, self.tokenizer = load_model_and_tokenizer(model, dtype=dtype, device=device)
        self.model.eval()
        self.batch_size, self.seed = batch_size, seed
        eos = self.model.generation_config.eos_token_id
        eos = eos if isinstance(eos, list) else [eos if eos is not None else self.tokenizer.eos_token_id]
        self.eos_ids = {int(token) for token in eos}

    def render(self, prompt: str, chat_template: bool) -> str:
        if not chat_template:
            return prompt
        return render_chat(self.tokenizer, prompt)

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        import torch

        from dapo_suite.sampling import sample_tokens

        # The samples of a problem decode together, sharing its prompt's KV cache (`samples_per_prompt`): the
        # prompt runs once and each decode step reads it once for all of them.
        by_problem: dict[str, list[int]] = {}
        for index, request in enumerate(requests):
            by_problem.setdefault(request.problem_id, []).append(index)
        texts = {pid: self.render(requests[rows[0]].prompt, sampling.chat_template) for pid, rows in by_problem.items()}
        lengths = dict(zip(texts, map(len, self.tokenizer(list(texts.values()), add_special_tokens=False)["input_ids"]),
                           strict=True))
        # Problems with as many pending samples batch together (one samples_per_prompt per batch); longest prompts
        # first, so similar lengths share a batch (less padding) and memory peaks early.
        order = sorted(by_problem, key=lambda pid: (-len(by_problem[pid]), -lengths[pid]))
        with tqdm(total=len(requests), desc="generate (hf)", unit="sample") as bar:
            for batch in self._batches(order, by_problem):
                group = len(by_problem[batch[0]])
                first = requests[by_problem[batch[0]][0]]
                generator = torch.Generator(self.model.device)
                generator.manual_seed(sample_seed(self.seed, first.problem_id, first.sample_index))
                inputs = self.tokenizer([texts[pid] for pid in batch], return_tensors="pt", padding=True,
                                        add_special_tokens=False).to(self.model.device)
                sampled = sample_tokens(self.model, inputs["input_ids"], inputs["attention_mask"], sampling.max_tokens,
                                        sampling.temperature, sampling.top_p, self.eos_ids, self.tokenizer.pad_token_id,
                                        samples_per_prompt=group, generator=generator)
                rows = [index for pid in batch for index in by_problem[pid]]  # output row j: prompt j // group
                for row, index in enumerate(rows):
                    tokens = sampled.tokens[row, : int(sampled.lengths[row])].tolist()
                    emit(self._completion(requests[index], tokens, bool(sampled.stopped[row])))
                bar.update(len(rows))

    def _batches(self, order: list[str], by_problem: dict[str, list[int]]):
        """Runs of problems with the same number of pending samples, at most batch_size rows (one problem at
        least) per batch."""
        batch: list[str] = []
        for pid in order:
            if batch and (len(by_problem[pid]) != len(by_problem[batch[0]])
                          or (len(batch) + 1) * len(by_problem[pid]) > self.batch_size):
                yield batch
                batch = []
            batch.append(pid)
        if batch:
            yield batch

    def _completion(self, request: Request, tokens: list[int], stopped: bool) -> Completion:
        """`tokens` end with the end-of-sequence token when `stopped` (it is counted, not decoded)."""
        text = self.tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=True)
        return Completion(request.problem_id, request.sample_index, text, "stop" if stopped else "length",
                          len(tokens))


class VLLMEngine:
    """vLLM offline inference (GPU only); requests go in chunks so finished samples reach disk early."""

    name = "vllm"
    chunk = 2048

    def __init__(self, model: str | None = None, dtype: str = "bfloat16", seed: int = 0):
        from dapo_suite.models import require_vllm, resolve_model

        require_vllm("The vllm engine", "On a CPU machine use --engine hf, or --endpoint URL of a running server.")
        from vllm import LLM

        self.llm = LLM(model=resolve_model(model), dtype="bfloat16" if dtype == "float32" else dtype, seed=seed)

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        from vllm import SamplingParams

        tokenizer = self.llm.get_tokenizer()
        for chunk in _chunks(list(requests), self.chunk):
            prompts = [
                render_chat(tokenizer, r.prompt) if sampling.chat_template else r.prompt
                for r in chunk
            ]
            params = [SamplingParams(n=1, temperature=sampling.temperature, top_p=sampling.top_p,
                                     max_tokens=sampling.max_tokens, seed=r.seed) for r in chunk]
            for request, output in zip(chunk, self.llm.generate(prompts, params, use_tqdm=True), strict=True):
                choice = output.outputs[0]
                emit(Completion(request.problem_id, request.sample_index, choice.text,
                                "length" if choice.finish_reason == "length" else "stop", len(choice.token_ids)))


RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class OpenAIEngine:
    """An OpenAI-compatible endpoint: chat completions (completions with chat_template=False)."""

    name = "openai"

    def __init__(self, endpoint: str, model: str | None = None, concurrency: int = 64, max_retries: int = 6,
                 timeout: float = 3600.0, backoff: float = 1.0, api_key: str = "EMPTY"):
        from dapo_suite.endpoint import connect_endpoint

        # One place normalises the URL and asks /v1/models for the name when --model is not given.
        served = connect_endpoint(endpoint, model)
        self.base_url, self.model = served.base_url, served.model_name
        self.concurrency, self.max_retries, self.timeout, self.backoff = concurrency, max_retries, timeout, backoff
        self.api_key = api_key
        import openai  # imported here (about 1 s), not inside the timed generation

        self.openai = openai

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        asyncio.run(self._generate_all(requests, sampling, emit))

    async def _generate_all(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        client = self.openai.AsyncOpenAI(base_url=self.base_url, api_key=self.api_key, max_retries=0,
                                         timeout=self.timeout)
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

    async def _one(self, client, limit: asyncio.Semaphore, request: Request, sampling: Sampling) -> Completion:
        """One sample, retried with exponential backoff on connection faults, timeouts, retryable statuses and
        malformed responses (a body that is not JSON, or no choices)."""
        openai = self.openai
        common = {"model": self.model, "temperature": sampling.temperature, "top_p": sampling.top_p,
                  "max_tokens": sampling.max_tokens, "seed": request.seed}
        attempt = 0
        while True:
            try:
                async with limit:
                    if sampling.chat_template:
                        response = await client.chat.completions.create(
                            messages=[{"role": "user", "content": request.prompt}], **common)
                    else:
                        response = await client.completions.create(prompt=request.prompt, **common)
                choice = response.choices[0]
                text = (choice.message.content if sampling.chat_template else choice.text) or ""
                tokens = response.usage.completion_tokens if response.usage else 0
                return Completion(request.problem_id, request.sample_index, text,
                                  "length" if choice.finish_reason == "length" else "stop", tokens)
            except (openai.APIConnectionError, openai.APITimeoutError, openai.APIStatusError,
                    openai.APIResponseValidationError, ValueError, TypeError, AttributeError, IndexError) as error:
                status = getattr(error, "status_code", None)
                if (status is not None and status not in RETRYABLE_STATUS) or attempt == self.max_retries:
                    kind = f"HTTP {status}" if status is not None else type(error).__name__
                    raise UserError(
                        f"--endpoint {self.base_url}: the request for sample {request.sample_index} of problem "
                        f"{request.problem_id} (model {self.model}) failed after {attempt + 1} attempt(s): {kind}: "
                        f"{str(error).splitlines()[0] if str(error) else '(no message)'}. Finished samples are on "
                        "disk: rerun the same command to resume.") from error
            await asyncio.sleep(min(self.backoff * 2**attempt, 60.0) * (0.5 + random.random()))
            attempt += 1


def sample_seed(seed: int, problem_id: str, sample_index: int) -> int:
    """A seed that depends only on (run seed, problem, sample), not on the order of requests."""
    import zlib

    return zlib.crc32(f"{seed}:{problem_id}:{sample_index}".encode()) & 0x7FFFFFFF


def engine_name(config) -> str:
    """The engine `config.engine` names; `auto` = openai with an endpoint, vllm on a GPU with vllm, else hf."""
    from dapo_suite.models import choose_engine

    return "openai" if config.engine == "auto" and config.endpoint else choose_engine(config.engine)


def engine_dtype(config) -> str:
    """`config.dtype` as the engine will load weights: "auto" -> bfloat16 for vLLM, and for hf where bf16 is
    native on the device it runs on (`dapo_suite.models.resolve_precision`), else float32."""
    if config.dtype != "auto":
        return config.dtype
    if engine_name(config) == "vllm":
        return "bfloat16"
    import torch

    from dapo_suite.models import resolve_precision

    return resolve_precision("auto", "cuda" if torch.cuda.is_available() else "cpu") or "float32"


def make_engine(config) -> Engine:
    """The engine `config` names (`engine_name`), loading weights in `engine_dtype(config)`."""
    engine = engine_name(config)
    if engine == "openai":
        return OpenAIEngine(config.endpoint, config.model, config.concurrency, config.max_retries,
                            config.request_timeout)
    if engine == "vllm":
        return VLLMEngine(config.model, engine_dtype(config), config.seed)
    return HFEngine(config.model, engine_dtype(config), config.batch_size, config.seed)

