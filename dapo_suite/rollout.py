"""Rollout engines: sample G responses per prompt and return them as `Rollout` records.

The trainer talks to one protocol (`RolloutEngine.generate`); engines are thin adapters that hold no algorithm
code. `HFRollout` is batched, KV-cached sampling with transformers (CPU or one GPU) and returns the behaviour
log-probs from the same forward passes, so no extra forward is needed for pi_old. `VLLMRollout` (GPU) samples
with vLLM and leaves pi_old to the trainer, as verl does, because vLLM's kernels differ numerically.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch


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

    @property
    def length(self) -> int:
        return int(self.response_ids.numel())


class RolloutEngine(Protocol):
    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float,
                 top_p: float) -> list[Rollout]: ...


def response_mask_from_eos(responses: torch.Tensor, eos_token_id: int) -> torch.Tensor:
    """1 on every token up to and including the first end-of-sequence token, 0 after it: (N, T) -> (N, T)."""
    is_eos = (responses == eos_token_id).long()
    eos_before = torch.cumsum(is_eos, dim=1) - is_eos
    return (eos_before == 0).long()


class HFRollout:
    """Batched sampling with `model.generate` (KV cache), recording log pi_old of each sampled token."""

    def __init__(self, model, tokenizer, chunk_size: int = 128) -> None:
        self.model, self.tokenizer, self.chunk_size = model, tokenizer, chunk_size

    @torch.no_grad()
    def generate(self, prompts: list[str], group_size: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0) -> list[Rollout]:
        prompts_per_chunk = max(1, self.chunk_size // group_size)  # chunks hold whole groups
        rollouts: list[Rollout] = []
        for start in range(0, len(prompts), prompts_per_chunk):
            chunk = prompts[start : start + prompts_per_chunk]
            for rollout in self._generate_chunk(chunk, group_size, max_new_tokens, temperature, top_p):
                rollout.group += start
                rollouts.append(rollout)
        return rollouts

    def _generate_chunk(self, prompts, group_size, max_new_tokens, temperature, top_p) -> list[Rollout]:
        tokenizer, model = self.tokenizer, self.model
        encoded = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        ids, attention = encoded["input_ids"], encoded["attention_mask"]
        was_training = model.training
        model.eval()
        # The G copies of a prompt share its prefix: run the prompt once and copy its KV cache G times, which
        # halves the cost of a generation batch on a CPU (the prompt is longer than the answers).
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        prefix = model(input_ids=ids[:, :-1], attention_mask=attention[:, :-1], position_ids=positions[:, :-1],
                       use_cache=True, logits_to_keep=1).past_key_values
        prefix.batch_repeat_interleave(group_size)
        ids, attention = ids.repeat_interleave(group_size, 0), attention.repeat_interleave(group_size, 0)
        output = model.generate(
            input_ids=ids, attention_mask=attention, past_key_values=prefix, do_sample=True,
            temperature=temperature, top_p=top_p, top_k=0, max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            output_logits=True, return_dict_in_generate=True,
        )
        model.train(was_training)
        responses = output.sequences[:, ids.shape[1]:]
        # log pi_old under the sampling temperature, as the trainer computes log pi_theta.
        log_probs = torch.stack(
            [torch.log_softmax(step.float() / temperature, dim=-1).gather(-1, responses[:, t : t + 1]).squeeze(-1)
             for t, step in enumerate(output.logits)], dim=1)
        mask = response_mask_from_eos(responses, tokenizer.eos_token_id)
        rollouts = []
        for row in range(responses.shape[0]):
            length = int(mask[row].sum())
            response = responses[row, :length]
            truncated = bool(length == max_new_tokens and response[-1] != tokenizer.eos_token_id)
            rollouts.append(Rollout(
                group=row // group_size, prompt_ids=ids[row][attention[row].bool()].cpu(), response_ids=response.cpu(),
                old_log_prob=log_probs[row, :length].cpu(), truncated=truncated,
                text=tokenizer.decode(response, skip_special_tokens=True),
            ))
        return rollouts


def make_engine(kind: str, model, tokenizer) -> RolloutEngine:
    """"hf", or "auto" (vLLM needs weight syncing from the trainer each step, which the embedded trainer does
    not do yet: on GPUs at scale use `--backend verl`, whose rollouts are vLLM)."""
    if kind in ("auto", "hf"):
        return HFRollout(model, tokenizer)
    raise ValueError("rollout_engine 'vllm' is used through `--backend verl` (Ray + vLLM with weight sync); "
                     "the embedded trainer samples with transformers ('hf' or 'auto')")
