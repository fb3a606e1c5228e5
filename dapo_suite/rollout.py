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

from dapo_suite.decoding import make_stepper
from dapo_suite.models import eval_mode, require_vllm, vllm_usable

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


@dataclass
class SampledBatch:
    """What `sample_tokens` returns: (N, T) tokens (pad after each row's end) and their log-probs, and per row
    the number of generated tokens (end-of-sequence token included) and whether it ended with one."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor


NUCLEUS_CANDIDATES = 256  # top-p looks for the nucleus among this many most likely tokens first


def _draw(weights: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One index per row with probability proportional to `weights` (N, K), by inverse CDF: one uniform per row.

    torch.multinomial draws an exponential per vocabulary entry (64 rows x 49k tokens: ~70 ms per step on a
    2-core CPU); a cumulative sum and a binary search take ~2 ms and draw from the same distribution."""
    cdf = weights.cumsum(dim=-1)
    target = torch.rand(weights.shape[0], 1, generator=generator, device=weights.device) * cdf[:, -1:]
    # right=True: the first entry whose cdf exceeds the target, so zero-weight entries are never drawn
    return torch.searchsorted(cdf, target, right=True).clamp(max=weights.shape[-1] - 1).squeeze(-1)


def sample_top_p(log_probs: torch.Tensor, top_p: float, generator: torch.Generator | None = None) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2019, arXiv 1904.09751): draw from the smallest set of most likely tokens
    whose probability mass reaches top_p. (N, V) -> (N,).

    The nucleus is looked for among the NUCLEUS_CANDIDATES most likely tokens (a partial top-k instead of sorting
    the whole vocabulary, ~60x cheaper); only rows whose nucleus is wider than that are sorted in full."""
    probs = log_probs.exp()
    if top_p >= 1.0:
        return _draw(probs, generator)
    top, order = probs.topk(min(NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1)  # descending
    wide = top.sum(dim=-1) <= top_p  # the nucleus may reach past the candidates
    if wide.any():
        full_top, full_order = probs[wide].sort(dim=-1, descending=True)
        sampled = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        sampled[~wide] = _nucleus_draw(top[~wide], order[~wide], top_p, generator)
        sampled[wide] = _nucleus_draw(full_top, full_order, top_p, generator)
        return sampled
    return _nucleus_draw(top, order, top_p, generator)


def _nucleus_draw(sorted_probs: torch.Tensor, order: torch.Tensor, top_p: float,
                  generator: torch.Generator | None) -> torch.Tensor:
    """Draw from descending probabilities cut to their nucleus; `order` maps positions back to token ids."""
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p  # mass before this token already reaches top_p
    return order.gather(-1, _draw(sorted_probs.masked_fill(outside, 0.0), generator).unsqueeze(-1)).squeeze(-1)


@torch.no_grad()
def sample_tokens(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                  temperature: float, top_p: float, eos_ids: set[int], pad_id: int, samples_per_prompt: int = 1,
                  generator: torch.Generator | None = None, dtype: torch.dtype | None = None,
                  decoder: str = "auto") -> SampledBatch:
    """KV-cached sampling from left-padded prompts that drops finished rows from the batch as it goes.

    `model.generate` keeps decoding a row after its end-of-sequence token until the longest row ends; on a CPU
    that is most of the work when answers are short and a few responses ramble to the limit. Here, once a
    quarter of the rows in the batch have finished, they are cut out of the KV cache. With
    `samples_per_prompt` = G, each prompt is run once, the G samples of a group share its KV cache (the lean
    stepper reads it once per step for the whole group), and output row i belongs to prompt i // G. Log-probs are of the temperature-scaled distribution
    before top-p, which is what the trainer recomputes as log pi.

    The prompt runs through the model's own forward; decode steps run through `decoding.make_stepper`
    (`decoder="hf"` forces transformers' step). `dtype` samples in another precision than the model's
    (e.g. bfloat16 where the CPU has native bf16 matmuls); the log-probs are then the sampler's, not the trainer's.
    """
    prefix_positions = (attention_mask.cumsum(-1) - 1).clamp(min=0)[:, :-1]
    # The prompt pass runs in the sampling dtype too (autocast: bf16 matmuls on f32 weights), so a bf16 sampler
    # does not spend its prompt pass at f32 speed.
    with torch.autocast(input_ids.device.type, dtype=dtype or model.dtype, enabled=dtype not in (None, model.dtype)):
        cache = model(input_ids=input_ids[:, :-1], attention_mask=attention_mask[:, :-1],
                      position_ids=prefix_positions, use_cache=True, logits_to_keep=1).past_key_values
    stepper = make_stepper(model, cache, attention_mask, max_new_tokens, dtype, decoder, samples_per_prompt)
    del cache  # the lean stepper copied it into its own buffer
    input_ids = input_ids.repeat_interleave(samples_per_prompt, 0)
    attention_mask = attention_mask.repeat_interleave(samples_per_prompt, 0)
    count, device = input_ids.shape[0], input_ids.device
    tokens = torch.full((count, max_new_tokens), pad_id, dtype=torch.long, device=device)
    log_probs = torch.zeros(count, max_new_tokens, device=device)
    lengths = torch.zeros(count, dtype=torch.long, device=device)
    stopped = torch.zeros(count, dtype=torch.bool, device=device)
    positions = attention_mask.sum(-1) - 1  # position of each row's last prompt token
    eos = torch.tensor(sorted(eos_ids), device=device)
    rows = torch.arange(count, device=device)  # which output row each batch row is
    alive = torch.ones(count, dtype=torch.bool, device=device)
    step_input = input_ids[:, -1]
    for step in range(max_new_tokens):
        logits = stepper.step(step_input, positions)
        if temperature > 0:
            step_log_probs = torch.log_softmax(logits / temperature, dim=-1)
            sampled = sample_top_p(step_log_probs, top_p, generator)
        else:  # greedy
            step_log_probs = torch.log_softmax(logits, dim=-1)
            sampled = logits.argmax(dim=-1)
        live_rows = rows[alive]
        tokens[live_rows, step] = sampled[alive]
        log_probs[live_rows, step] = step_log_probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1)[alive]
        lengths[live_rows] += 1
        ended = alive & torch.isin(sampled, eos)
        stopped[rows[ended]] = True
        alive &= ~ended
        if not alive.any():
            break
        if (~alive).sum() * 4 >= alive.numel():
            keep = alive.nonzero().squeeze(-1)
            stepper.select(keep)
            rows, alive, sampled, positions = rows[keep], alive[keep], sampled[keep], positions[keep]
        step_input = sampled
        positions = positions + 1
    return SampledBatch(tokens, log_probs, lengths, stopped)


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

        from serve.endpoint import free_port

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
    if config.rollout_engine == "hf" or (config.rollout_engine == "auto"
                                         and not (vllm_usable() and model.device.type == "cuda")):
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
