"""Token sampling shared by the trainer's HF rollout engine and the evaluator's HF engine: KV-cached decoding
of left-padded prompts with temperature and nucleus (top-p) sampling, returning the sampled tokens and their
log-probs (`sample_tokens`). Decode steps run through `decoding.make_stepper`."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dapo_suite.decoding import make_stepper


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


# What one more prompt pass costs, in padded prompt tokens. Measured (bf16, 2 threads, the first 64 GSM8K prompts:
# 148 tokens on average, 215 the longest): one padded pass 8.06 s; in runs, 4.49 s at 256 (4 runs), 4.36 s at 64
# (7 runs), 4.50 s at 16 (14 runs). 16 prompts: 1.37 s in one pass, 1.09 s at 64 (3 runs).
PREFILL_PASS_COST = 64


def length_buckets(lengths: list[int], pass_cost: int = PREFILL_PASS_COST) -> list[list[int]]:
    """Split prompts into runs of similar length, one prompt pass each, minimising the tokens computed: each run
    pads to its longest prompt, and each pass costs `pass_cost` tokens more. Exact, by dynamic programming over
    the prompts sorted longest first (a run is contiguous in that order). Returns indices into `lengths`."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = [0] + [None] * len(order)  # best[j]: cheapest split of the j longest prompts
    start = [0] * (len(order) + 1)
    for end in range(1, len(order) + 1):
        for first in range(end):
            cost = best[first] + (end - first) * lengths[order[first]] + pass_cost
            if best[end] is None or cost < best[end]:
                best[end], start[end] = cost, first
    runs, end = [], len(order)
    while end:
        runs.append(order[start[end] : end])
        end = start[end]
    return runs[::-1]


@torch.no_grad()
def prefill(model, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, dtype: torch.dtype):
    """The KV cache of every prompt's prefix (its tokens but the last, left-padded), as one DynamicCache.

    Prompts of a generation batch differ in length (64 GSM8K prompts: 148 tokens on average, 215 the longest), and
    one padded pass computes the padding too (quadratically in attention). The pass runs instead once per run of
    similar lengths (`length_buckets`), each cut to its own longest prefix, and the runs' keys and values are
    placed back into one left-padded cache. Runs in `dtype` (autocast: bf16 matmuls on f32 weights) so a bf16
    sampler does not spend its prompt pass at f32 speed."""
    from transformers import DynamicCache

    lengths = prefix_mask.sum(-1)
    runs = length_buckets(lengths.tolist())
    if len(runs) == 1:
        runs = [list(range(prefix_ids.shape[0]))]  # one pass, rows in their own order (the cache is returned as is)
    width, parts = prefix_ids.shape[1], []
    with torch.autocast(prefix_ids.device.type, dtype=dtype, enabled=dtype != model.dtype):
        for run in runs:
            index = torch.tensor(run, device=prefix_ids.device)
            cut = width if len(runs) == 1 else max(1, int(lengths[index].max()))  # keep a 1-token prompt's column
            ids, mask = prefix_ids[index, width - cut :], prefix_mask[index, width - cut :]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                          logits_to_keep=1).past_key_values
            parts.append((index, cut, cache))
    if len(parts) == 1:
        return parts[0][2]
    merged = DynamicCache()
    for layer in range(len(parts[0][2].layers)):
        template = parts[0][2].layers[layer].keys  # (rows of the run, kv heads, cut, head dim)
        keys = template.new_zeros(prefix_ids.shape[0], template.shape[1], width, template.shape[3])
        values = torch.zeros_like(keys)
        for index, cut, cache in parts:
            keys[index, :, width - cut :] = cache.layers[layer].keys
            values[index, :, width - cut :] = cache.layers[layer].values
        merged.update(keys, values, layer)
    return merged


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

    The prompt runs through the model's own forward (`prefill`, in runs of similar length); decode steps run
    through `decoding.make_stepper` (`decoder="hf"` forces transformers' step). `dtype` samples in another precision than the model's
    (e.g. bfloat16 where the CPU has native bf16 matmuls); the log-probs are then the sampler's, not the trainer's.
    """
    cache = prefill(model, input_ids[:, :-1], attention_mask[:, :-1], dtype or model.dtype)
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
