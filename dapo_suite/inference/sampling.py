"""Token sampling shared by the trainer's HF rollout engine and the evaluator's HF engine: KV-cached decoding
of left-padded prompts with temperature and nucleus (top-p) sampling, returning the sampled tokens and their
log-probs (`sample_tokens`). Decode steps run through `decoding.make_stepper`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from dapo_suite.core.threads import free_cores
from dapo_suite.inference.decoding import make_stepper
from dapo_suite.inference.fused_step import kernels
from dapo_suite.inference.prefill import PrefixCache
from dapo_suite.inference.weights import StepperWeights


@dataclass
class SampledBatch:
    """What `sample_tokens` returns: (N, T) tokens (pad after each row's end), their log-probs and the entropy
    of the distribution each was drawn from, and per row the number of generated tokens (end-of-sequence token
    included), whether it ended with one, and whether the caller's stop rule ended it (`paused`: a tool call
    to run before the row goes on)."""

    tokens: torch.Tensor
    log_probs: torch.Tensor
    lengths: torch.Tensor
    stopped: torch.Tensor
    paused: torch.Tensor | None = None
    entropies: torch.Tensor | None = None


class StopRule(Protocol):
    """Ends a row before its end-of-sequence token: `trigger_ids` are the tokens after which `matches` is
    asked (rarely, so a decode step stays cheap), with the row's generated tokens so far."""

    trigger_ids: torch.Tensor

    def matches(self, row: int, tokens: torch.Tensor) -> bool: ...


# a token's log-prob and its most likely alternatives, (token id, log-prob) in descending order
TokenLogProb = tuple[float, list[tuple[int, float]]]

NUCLEUS_CANDIDATES = 256  # top-p looks for the nucleus among this many most likely tokens first


def _draw(weights: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """One index per row with probability proportional to `weights` (N, K), by inverse CDF of the row's
    uniform (N,) in [0, 1).

    torch.multinomial draws an exponential per vocabulary entry; a cumulative sum and a binary search draw
    from the same distribution for far less (docs/benchmarks.md). One uniform per row, drawn by the caller, is
    also what lets each row of a batch follow its own seed (`row_uniforms`)."""
    cdf = weights.cumsum(dim=-1)
    target = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[:, -1:]
    # right=True: the first entry whose cdf exceeds the target, so zero-weight entries are never drawn
    return torch.searchsorted(cdf, target, right=True).clamp(max=weights.shape[-1] - 1).squeeze(-1)


def row_uniforms(generators: list[torch.Generator]) -> torch.Tensor:
    """One uniform per row, row i from `generators[i]`: a batch whose rows are seeded separately (the
    endpoint's requests) draws each row's tokens from its own stream, whatever else shares the batch."""
    return torch.cat([torch.rand(1, generator=generator) for generator in generators])


def sample_top_p(
    log_probs: torch.Tensor,
    top_p: float,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> torch.Tensor:
    """Nucleus sampling (Holtzman et al. 2019, arXiv 1904.09751): draw from the smallest set of most likely
    tokens whose probability mass reaches top_p. (N, V) -> (N,). One uniform per row: `uniforms` (N,), else
    drawn from `generator`.

    The nucleus is looked for among the NUCLEUS_CANDIDATES most likely tokens (a partial top-k instead of
    sorting the whole vocabulary, which costs far more); only rows whose nucleus is wider than that are sorted
    in full."""
    if uniforms is None:
        uniforms = torch.rand(log_probs.shape[0], generator=generator, device=log_probs.device)
    probs = log_probs.exp()
    if top_p >= 1.0:
        return _draw(probs, uniforms)
    top, order = probs.topk(min(NUCLEUS_CANDIDATES, probs.shape[-1]), dim=-1)  # descending
    wide = top.sum(dim=-1) <= top_p  # the nucleus may reach past the candidates
    if wide.any():
        full_top, full_order = probs[wide].sort(dim=-1, descending=True)
        sampled = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        sampled[~wide] = _nucleus_draw(top[~wide], order[~wide], top_p, uniforms[~wide])
        sampled[wide] = _nucleus_draw(full_top, full_order, top_p, uniforms[wide])
        return sampled
    return _nucleus_draw(top, order, top_p, uniforms)


def _nucleus_draw(
    sorted_probs: torch.Tensor, order: torch.Tensor, top_p: float, uniforms: torch.Tensor
) -> torch.Tensor:
    """Draw from descending probabilities cut to their nucleus; `order` maps positions back to token ids."""
    outside = (
        sorted_probs.cumsum(dim=-1) - sorted_probs > top_p
    )  # mass before this token already reaches top_p
    return order.gather(-1, _draw(sorted_probs.masked_fill(outside, 0.0), uniforms).unsqueeze(-1)).squeeze(-1)


def next_tokens(
    logits: torch.Tensor,
    temperature: float,
    top_p: float,
    generator: torch.Generator | None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each row's next token (temperature, then top-p; greedy at temperature 0), its log-prob under
    softmax(logits / T) (T = 1 when greedy), and that distribution's entropy H = -sum p log p (what was
    sampled from, before top-p: `rollout/entropy`). logits (N, V) -> tokens (N,), log-probs (N,), entropies
    (N,). One uniform per row: `uniforms` (N,), else drawn from `generator`.

    On a CPU this is one call of the fused kernel (`fused_step`), much faster than the torch ops below
    (log-softmax, top-k, draw; docs/benchmarks.md), which remain where the kernel is not built and on other
    devices."""
    if uniforms is None and temperature > 0:
        uniforms = torch.rand(logits.shape[0], generator=generator, device=logits.device)
    fused = kernels() if logits.device.type == "cpu" else None
    if fused is not None:
        return fused.sample_next(
            logits.contiguous(),
            temperature,
            top_p,
            uniforms if temperature > 0 else torch.zeros(logits.shape[0]),
        )
    if temperature > 0:
        step_log_probs = torch.log_softmax(logits / temperature, dim=-1)
        sampled = sample_top_p(step_log_probs, top_p, uniforms=uniforms)
    else:  # greedy
        step_log_probs = torch.log_softmax(logits, dim=-1)
        sampled = logits.argmax(dim=-1)
    entropies = -(step_log_probs.exp() * step_log_probs).sum(-1)
    return sampled, step_log_probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1), entropies


def scored_tokens(
    logits: torch.Tensor, tokens: torch.Tensor, temperatures: list[float], top: list[int]
) -> list[TokenLogProb]:
    """Each row's token log-prob under softmax(logits / T) (T = 1 where greedy: the distribution `next_tokens`
    samples from, before top_p) with its `top[i]` most likely alternatives. logits (N, V), tokens (N,).
    Computed in float32 for these rows only, so rows that ask for no log-probs cost nothing."""
    scale = torch.tensor([temperature or 1.0 for temperature in temperatures]).unsqueeze(-1)
    log_probs = torch.log_softmax(logits.float() / scale, dim=-1)
    chosen = log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).tolist()
    widest = max(top, default=0)
    values, ids = log_probs.topk(widest, dim=-1) if widest else (log_probs[:, :0], tokens[:, None][:, :0])
    values, ids = values.tolist(), ids.tolist()
    return [
        (chosen[row], list(zip(ids[row][:count], values[row][:count], strict=True)))
        for row, count in enumerate(top)
    ]


@torch.no_grad()
def sample_tokens(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    temperature: float,
    top_p: float,
    eos_ids: set[int],
    pad_id: int,
    samples_per_prompt: int = 1,
    generator: torch.Generator | None = None,
    dtype: torch.dtype | None = None,
    decoder: str = "auto",
    weights: StepperWeights | None = None,
    stop_rule: StopRule | None = None,
    prefix_cache: PrefixCache | None = None,
) -> SampledBatch:
    """KV-cached sampling from left-padded prompts that drops finished rows from the batch as it goes.

    `model.generate` keeps decoding a row after its end-of-sequence token until the longest row ends; on a CPU
    that is most of the work when answers are short and a few responses ramble to the limit. Here, once a
    quarter of the rows in the batch have finished, they are cut out of the KV cache. With
    `samples_per_prompt` = G, each prompt is run once, the G samples of a group share its KV cache (the lean
    stepper reads it once per step for the whole group), and output row i belongs to prompt i // G. Log-probs
    are of the temperature-scaled distribution before top-p, which is what the trainer recomputes as log pi.

    The stepper from `decoding.make_stepper` runs the prompts (the bf16 lean stepper its own packed pass, else
    the model's forward in runs of similar length) and the decode steps (`decoder="hf"` forces transformers'
    step). `dtype` samples in another precision than the model's (e.g. bfloat16 where the CPU has native bf16
    matmuls); the log-probs are then the sampler's, not the trainer's. `weights`: the lean stepper's snapshot
    of the model's weights in `dtype`, for a caller that samples many times between two updates
    (`weights.StepperWeights`). `stop_rule` ends rows early (a finished code block: `tool_loop`); those rows
    come back `paused`. `prefix_cache`: the beginning the prompts share computed once (`prefill.PrefixCache`;
    valid for one snapshot of the weights).
    """
    with free_cores.sampling() as cores:  # threads on the cores other programs leave free (core/threads.py)
        stepper = make_stepper(
            model,
            input_ids,
            attention_mask,
            max_new_tokens,
            dtype,
            decoder,
            samples_per_prompt,
            prefix_cache,
            weights,
        )
        input_ids = input_ids.repeat_interleave(samples_per_prompt, 0)
        attention_mask = attention_mask.repeat_interleave(samples_per_prompt, 0)
        count, device = input_ids.shape[0], input_ids.device
        tokens = torch.full((count, max_new_tokens), pad_id, dtype=torch.long, device=device)
        log_probs = torch.zeros(count, max_new_tokens, device=device)
        entropies = torch.zeros(count, max_new_tokens, device=device)
        lengths = torch.zeros(count, dtype=torch.long, device=device)
        stopped = torch.zeros(count, dtype=torch.bool, device=device)
        paused = torch.zeros(count, dtype=torch.bool, device=device)
        positions = attention_mask.sum(-1) - 1  # position of each row's last prompt token
        eos = torch.tensor(sorted(eos_ids), device=device)
        rows = torch.arange(count, device=device)  # which output row each batch row is
        alive = torch.ones(count, dtype=torch.bool, device=device)
        step_input = input_ids[:, -1]
        for step in range(max_new_tokens):
            if cores:
                cores.adapt()
            sampled, step_log_probs, step_entropies = next_tokens(
                stepper.step(step_input, positions), temperature, top_p, generator
            )
            live_rows = rows[alive]
            tokens[live_rows, step] = sampled[alive]
            log_probs[live_rows, step] = step_log_probs[alive]
            entropies[live_rows, step] = step_entropies[alive].float()
            lengths[live_rows] += 1
            ended = alive & torch.isin(sampled, eos)
            stopped[rows[ended]] = True
            if stop_rule is not None:
                for index in (
                    (alive & ~ended & torch.isin(sampled, stop_rule.trigger_ids)).nonzero().flatten().tolist()
                ):
                    row = int(rows[index])
                    if stop_rule.matches(row, tokens[row, : lengths[row]]):
                        paused[row] = ended[index] = True
            alive &= ~ended
            if not alive.any():
                break
            if (~alive).sum() * 4 >= alive.numel():
                keep = alive.nonzero().squeeze(-1)
                stepper.select(keep)
                rows, alive, sampled, positions = rows[keep], alive[keep], sampled[keep], positions[keep]
            step_input = sampled
            positions = positions + 1
        return SampledBatch(tokens, log_probs, lengths, stopped, paused, entropies)
