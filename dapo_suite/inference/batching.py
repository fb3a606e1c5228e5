"""Continuous batching: independent generation requests (the endpoint's) decoded together, one token each per
step, each streamed as it is sampled.

A request joins the running batch instead of waiting for it to end: its prompt runs through the model alone
and its keys and values are placed beside the running rows' (`LeanStepper.add_rows`), so one decode step
serves every request in flight. A finished or cancelled row leaves the batch at once (`select`). Each row
samples with its own temperature, top_p and random stream (a request's seed), so what one request gets does
not depend on which others share its batch, up to float rounding: a batched matrix product may round
differently from a single row's.

Costs on a CPU (what the admission rules are for): a decode step reads the weights once for all rows, so 16
rows cost little more than one; joining rows copies the running rows' cache once, so joins are gathered (at
most one every `join_every` steps while a batch runs) and the cache is capped (`kv_cache_bytes`).
"""

from __future__ import annotations

import collections
import secrets
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from dapo_suite.core.threads import FreeCores, free_cores
from dapo_suite.inference.decoding import lean_supported, make_stepper
from dapo_suite.inference.prefill import PrefixCache
from dapo_suite.inference.sampling import TokenLogProb, next_tokens, row_uniforms, scored_tokens
from dapo_suite.inference.weights import StepperWeights

if TYPE_CHECKING:
    from dapo_suite.inference.structured import Constraint

# (kind, value): ("token", id) for every sampled token (the end-of-sequence token included), then one
# ("end", "stop" | "length" | "cancelled") or ("error", message)
Event = tuple[str, object]


@dataclass(eq=False)
class GenerationJob:
    """One request: its prompt's token ids and sampling settings; `emit` receives its events from the decoding
    thread (the caller hands them to its own thread or event loop). Set `cancelled` to stop it at the next
    step. With `top_logprobs` (0 or more alternatives), each sampled token's log-prob is appended to
    `logprobs` before its event is emitted."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    emit: Callable[[Event], None] = field(default=lambda event: None, repr=False)
    top_logprobs: int | None = None
    # run to max_tokens through end-of-sequence tokens (benchmarks: equal work per request)
    ignore_eos: bool = False
    cancelled: bool = False
    # structured outputs: the grammar each next token must follow (dapo_suite.inference.structured)
    constraint: Constraint | None = field(default=None, repr=False)
    logprobs: list[TokenLogProb] = field(default_factory=list, repr=False)
    produced: int = 0
    generator: torch.Generator = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # its own stream: seeded, it repeats; unseeded, it is still independent of every other row's
        seed = self.seed if self.seed is not None else secrets.randbits(63)
        self.generator = torch.Generator().manual_seed(seed)


def kv_bytes_per_token(model, dtype: torch.dtype) -> int:
    """Bytes of keys and values one token of one row holds in the cache, all layers."""
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype.itemsize


class BatchDecoder:
    """Decodes submitted jobs on a thread of its own, as one batch. `submit` is thread-safe and returns at
    once."""

    def __init__(
        self,
        model,
        eos_ids: set[int],
        pad_id: int,
        dtype: torch.dtype | None = None,
        max_rows: int = 64,
        kv_cache_bytes: int = 4 << 30,
        join_every: int = 1,
    ) -> None:
        self.model, self.eos_ids, self.pad_id = model, eos_ids, pad_id
        self.dtype = dtype or model.dtype
        self.max_rows, self.join_every = max_rows, join_every
        self.token_bytes = kv_bytes_per_token(model, self.dtype)
        self.kv_cache_bytes = kv_cache_bytes
        self.prefix_cache = PrefixCache()  # prompts in one template compute their common beginning once
        # the model's weights are fixed while it serves (as the prefix cache assumes): cast and packed once
        self.weights = StepperWeights(model, self.dtype) if lean_supported(model) else None
        self._pending: collections.deque[GenerationJob] = collections.deque()
        self._wake = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="batch-decoder", daemon=True)
        self._thread.start()

    def submit(self, *jobs: GenerationJob) -> None:
        """Queue `jobs` together: they start in the same step (the choices of one request)."""
        with self._wake:
            self._pending.extend(jobs)
            self._wake.notify()

    def warm_up(self, prompt_ids: list[int], timeout_s: float = 900.0) -> None:
        """Decode two tokens and wait: the first decode builds the sampler's kernels (`fused_step`, a C++
        compile of about a minute on a fresh machine) and warms torch's, which should happen before a server
        says it is ready, not in its first client's request."""
        done = threading.Event()
        failure: list[object] = []

        def emit(event: Event) -> None:
            if event[0] == "error":
                failure.append(event[1])
            if event[0] != "token":
                done.set()

        self.submit(GenerationJob(prompt_ids, 2, emit=emit))
        if not done.wait(timeout_s) or failure:
            raise RuntimeError(f"the warm-up generation failed: {failure[0] if failure else 'timed out'}")

    def _take(self, running: int, width: int, block: bool) -> list[GenerationJob]:
        """Pending jobs (first come, first served) that fit beside `running` rows whose cache is `width` slots
        wide (filled and to come): at most `max_rows` rows, at most `kv_cache_bytes` of cache. A job that fits
        no batch on its own is still taken when nothing runs (it may then use more than the cap)."""
        with self._wake:
            while block and not self._pending:
                self._wake.wait()
            taken: list[GenerationJob] = []
            while self._pending and running + len(taken) < self.max_rows:
                job = self._pending[0]
                if job.cancelled:
                    self._pending.popleft()
                    job.emit(("end", "cancelled"))
                    continue
                wider = max(width, len(job.prompt_ids) + job.max_tokens)
                if (running + len(taken) + 1) * wider * self.token_bytes > self.kv_cache_bytes and (
                    running or taken
                ):
                    break
                taken.append(self._pending.popleft())
                width = wider
            return taken

    def _left_padded(self, jobs: list[GenerationJob]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(job.prompt_ids) for job in jobs)
        ids = torch.full((len(jobs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros(len(jobs), width, dtype=torch.long)
        for row, job in enumerate(jobs):
            ids[row, width - len(job.prompt_ids) :] = torch.tensor(job.prompt_ids)
            mask[row, width - len(job.prompt_ids) :] = 1
        return ids, mask

    def _sample(self, logits: torch.Tensor, jobs: list[GenerationJob]) -> torch.Tensor:
        """Each row's next token with its own settings: rows that share (temperature, top_p) sample together,
        each from its own stream."""
        sampled = torch.empty(len(jobs), dtype=torch.long)
        for row, job in enumerate(jobs):
            if job.constraint is not None:
                job.constraint.mask(logits[row])
        settings: dict[tuple[float, float], list[int]] = collections.defaultdict(list)
        for row, job in enumerate(jobs):
            settings[(job.temperature, job.top_p)].append(row)
        for (temperature, top_p), rows in settings.items():
            index = torch.tensor(rows)
            uniforms = row_uniforms([jobs[row].generator for row in rows]) if temperature > 0 else None
            sampled[index] = next_tokens(logits[index], temperature, top_p, None, uniforms)[0]
        scored = [row for row, job in enumerate(jobs) if job.top_logprobs is not None]
        if scored:  # only the rows that asked: the others keep the fused kernel's path alone
            index = torch.tensor(scored)
            found = scored_tokens(
                logits[index],
                sampled[index],
                [jobs[row].temperature for row in scored],
                [jobs[row].top_logprobs for row in scored],
            )
            for row, token_log_prob in zip(scored, found, strict=True):
                jobs[row].logprobs.append(token_log_prob)
        for row, job in enumerate(jobs):
            if job.constraint is not None:
                job.constraint.accept(int(sampled[row]))
        return sampled

    def score_prompt(self, prompt_ids: list[int], temperature: float, top: int) -> list[TokenLogProb]:
        """The log-prob of each prompt token after the first (and its `top` alternatives) under the model's
        forward in its own precision, at `temperature` as `scored_tokens` reads it: OpenAI's `echo`.
        Thread-safe: it reads the model's weights and nothing the decoding thread writes."""
        ids = torch.tensor([prompt_ids])
        with torch.inference_mode():
            logits = self.model(input_ids=ids, use_cache=False).logits[0, :-1]
        return scored_tokens(
            logits, ids[0, 1:], [temperature] * (len(prompt_ids) - 1), [top] * (len(prompt_ids) - 1)
        )

    def _run(self) -> None:
        while True:
            jobs = self._take(0, 0, block=True)
            if not jobs:
                continue
            try:
                with torch.inference_mode(), free_cores.sampling() as cores:
                    self._decode(jobs, cores)
            except Exception as error:  # noqa: BLE001 - the thread must outlive a failed batch; its jobs get the error
                for job in jobs:
                    job.emit(("error", f"{type(error).__name__}: {error}"))

    def _decode(self, jobs: list[GenerationJob], cores: FreeCores | None = None) -> None:
        """Decode `jobs` (a list this method extends and shrinks in place) until every row has ended."""
        ids, mask = self._left_padded(jobs)
        stepper = make_stepper(
            self.model,
            ids,
            mask,
            max(job.max_tokens for job in jobs),
            self.dtype,
            prefix_cache=self.prefix_cache,
            weights=self.weights,
        )
        positions, step_input = mask.sum(-1) - 1, ids[:, -1]
        width = ids.shape[1] + max(job.max_tokens for job in jobs)
        since_join = 0
        while jobs:
            if cores:
                cores.adapt()
            sampled = self._sample(stepper.step(step_input, positions), jobs)
            keep = []
            for row, (job, token) in enumerate(zip(jobs, sampled.tolist(), strict=True)):
                job.produced += 1
                job.emit(("token", token))
                finish = (
                    "stop"
                    if token in self.eos_ids and not job.ignore_eos
                    else "length"
                    if job.produced >= job.max_tokens
                    else "cancelled"
                    if job.cancelled
                    else None
                )
                if finish is None:
                    keep.append(row)
                else:
                    job.emit(("end", finish))
            if not keep:
                return
            positions, step_input = positions + 1, sampled
            if len(keep) < len(jobs):
                index = torch.tensor(keep)
                stepper.select(index)
                jobs[:] = [jobs[row] for row in keep]
                positions, step_input = positions[index], step_input[index]
            since_join += 1
            if since_join >= self.join_every and hasattr(stepper, "add_rows") and not stepper.shared:
                joining = self._take(len(jobs), width, block=False)
                if joining:
                    ids, mask = self._left_padded(joining)
                    stepper.add_rows(
                        self.model, ids, mask, max(job.max_tokens for job in joining), self.max_rows
                    )
                    jobs.extend(joining)
                    positions = torch.cat([positions, mask.sum(-1) - 1])
                    step_input = torch.cat([step_input, ids[:, -1]])
                    width = stepper.kv.shape[4]  # a rebuild may have dropped slots no row reads
                    since_join = 0
