"""Rollout engines: sample G responses per prompt and return them as `Rollout` records.

The trainer talks to one protocol (`RolloutEngine`: `generate`, and `sync_weights` after each update); engines are
thin adapters that hold no algorithm code. `HFRollout` is batched, KV-cached sampling with transformers (CPU or one
GPU) on the trainer's own module, and returns the behaviour log-probs from the same forward passes, so no extra
forward is needed for pi_old. `VLLMRollout` (one GPU) samples with vLLM in the trainer's process, takes the policy's
weights after every update, and leaves pi_old to the trainer, as verl does, because vLLM's kernels differ
numerically from the ones the trainer differentiates.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Protocol

import torch

from dapo_suite.models import choose_engine, eval_mode, require_vllm
from dapo_suite.sampling import sample_tokens

log = logging.getLogger(__name__)


@dataclass
class Rollout:
    """One sampled response. Token tensors are 1-D and unpadded."""

    group: int  # index of its prompt in the generation batch (responses of one prompt form a group)
    prompt_ids: torch.Tensor  # (P,)
    response_ids: torch.Tensor  # (T,) through the end-of-sequence token when there is one
    old_log_prob: torch.Tensor | None  # (T,) log pi_old of each response token, or None to recompute
    truncated: bool  # hit max_response_length without an end-of-sequence token
    text: str
    score: float = 0.0  # correctness reward, +1 / -1
    acc: bool = False
    reward: float = 0.0  # score + overlong penalty: what the advantage is computed from
    advantage: float = 0.0
    rollout_log_prob: torch.Tensor | None = None  # (T,) the sampler's own log-probs, kept when the trainer
    #   recomputes old_log_prob for rollout correction (they come from another dtype or engine)

    @property
    def length(self) -> int:
        return int(self.response_ids.numel())


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float, seed: int | None = None) -> list[Rollout]: ...

    def sync_weights(self) -> None:
        """Make the next samples come from the policy's current weights."""


class HFRollout:
    """Batched sampling with `model.generate` (KV cache), recording log pi_old of each sampled token."""

    def __init__(self, model, tokenizer, chunk_size: int = 128, dtype: str | None = None) -> None:
        self.model, self.tokenizer, self.chunk_size = model, tokenizer, chunk_size
        self.dtype = getattr(torch, dtype) if dtype else None  # sampling precision; None = the model's

    def sync_weights(self) -> None:
        """Nothing to copy: this engine samples with the trainer's own module."""

    @torch.no_grad()
    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None) -> list[Rollout]:
        """With `seed`, samples come from a generator of their own; without, from torch's global one."""
        generator = None
        if seed is not None:
            generator = torch.Generator(self.model.device).manual_seed(seed)
        prompts_per_chunk = max(1, self.chunk_size // group_size)  # chunks hold whole groups
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), prompts_per_chunk):
            chunk = prompts[start : start + prompts_per_chunk]
            for rollout in self._generate_chunk(chunk, group_size, max_new_tokens, temperature, top_p, generator):
                rollout.group += start
                rollouts.append(rollout)
        return rollouts

    def _generate_chunk(self, prompts, group_size, max_new_tokens, temperature, top_p, generator) -> list[Rollout]:
        tokenizer, model = self.tokenizer, self.model
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        ids, attention = encoded["input_ids"], encoded["attention_mask"]
        # The G samples of a prompt share its prefix: sample_tokens runs the prompt once and copies its KV cache,
        # which halves the cost of a generation batch on a CPU (the prompt is longer than the answers).
        with eval_mode(model):
            sampled = sample_tokens(model, ids, attention, max_new_tokens, temperature, top_p,
                                    {tokenizer.eos_token_id}, tokenizer.pad_token_id, samples_per_prompt=group_size,
                                    generator=generator, dtype=self.dtype)
        prompt_ids = [ids[group][attention[group].bool()].cpu() for group in range(ids.shape[0])]
        rollouts = []
        for row in range(sampled.tokens.shape[0]):
            length = int(sampled.lengths[row])
            response = sampled.tokens[row, :length]
            rollouts.append(Rollout(
                group=row // group_size, prompt_ids=prompt_ids[row // group_size], response_ids=response.cpu(),
                old_log_prob=sampled.log_probs[row, :length].cpu(), truncated=not bool(sampled.stopped[row]),
                text=tokenizer.decode(response, skip_special_tokens=True),
            ))
        return rollouts


class VLLMRollout:
    """vLLM on the trainer's GPU, in the trainer's process, sampling from the policy's latest weights.

    vLLM's `external_launcher` executor runs the model in this process instead of an engine subprocess, so
    `sync_weights` can hand the policy's tensors to vLLM's own `load_weights` (which maps Hugging Face names onto
    its fused layers) with no copy through the host. The returned rollouts carry no log-probs: the trainer
    recomputes pi_old with its own forward pass before any update."""

    def __init__(self, model, tokenizer, max_model_len: int, gpu_memory_utilization: float, seed: int = 0) -> None:
        require_vllm("rollout_engine 'vllm'", "On a CPU machine use rollout_engine=hf (or auto).")
        from vllm import LLM

        from dapo_suite.endpoint import free_port

        # A one-process "distributed" group for the external launcher: this process is rank 0 of 1.
        for name, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                            ("MASTER_PORT", str(free_port()))):
            os.environ.setdefault(name, value)
        self.model, self.tokenizer = model, tokenizer
        self.llm = LLM(model=model.name_or_path, dtype=str(model.dtype).removeprefix("torch."), seed=seed,
                       max_model_len=max_model_len, gpu_memory_utilization=gpu_memory_utilization,
                       distributed_executor_backend="external_launcher", enable_prefix_caching=True)

    @torch.no_grad()
    def sync_weights(self) -> None:
        vllm_model = self.llm.llm_engine.model_executor.driver_worker.model_runner.model
        vllm_model.load_weights((name, tensor.detach()) for name, tensor in self.model.state_dict().items())
        self.llm.reset_prefix_cache()  # cached prefixes hold keys and values computed with the old weights

    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int | None = None) -> list[Rollout]:
        from vllm import SamplingParams

        prompt_ids = [self.tokenizer(prompt, add_special_tokens=False)["input_ids"] for prompt in prompts]
        params = SamplingParams(n=group_size, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                                seed=seed)
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)
        rollouts = []
        for group, output in enumerate(outputs):
            prompt = torch.tensor(prompt_ids[group], dtype=torch.long)
            for sample in output.outputs:
                response = torch.tensor(list(sample.token_ids), dtype=torch.long)  # may be empty
                rollouts.append(Rollout(group=group, prompt_ids=prompt, response_ids=response,
                                        old_log_prob=None, truncated=sample.finish_reason == "length",
                                        text=sample.text))
        return rollouts


def make_engine(config, model, tokenizer) -> RolloutEngine:
    """The engine `config.rollout_engine` names: "hf"; "vllm" (one GPU); or "auto", which is vLLM when it is
    installed and the policy is on a GPU, else "hf". On "auto", a vLLM that fails to start falls back to "hf"
    with a warning that carries the error; on "vllm" the error stops the run."""
    if choose_engine(config.rollout_engine, on_gpu=model.device.type == "cuda") == "hf":
        return HFRollout(model, tokenizer, dtype=config.sampling_dtype)
    max_model_len = config.max_prompt_length + max(config.max_response_length, config.eval_max_tokens)
    try:
        return VLLMRollout(model, tokenizer, max_model_len, config.rollout_gpu_memory_utilization, config.seed)
    except Exception as error:
        if config.rollout_engine == "vllm":
            raise
        log.warning("vLLM did not start (%s: %s); sampling with transformers instead. Set rollout_engine=vllm "
                    "to stop on this error, or rollout_engine=hf to skip vLLM.", type(error).__name__, error)
        return HFRollout(model, tokenizer, dtype=config.sampling_dtype)
