"""The prompt pass on transformers' forward, for the steppers that do not run their own
(`decoding.make_stepper`): `prefill`, the prompts' KV cache in runs of similar length (`length_buckets`), and
`cached_prefill`, which computes the beginning that prompts share once, across calls too (`PrefixCache`). The
lean stepper on the fused kernels runs its own packed pass instead (`decoding.LeanStepper._packed_prefill`),
with the same `PrefixCache`."""

from __future__ import annotations

import torch

# What one more prompt pass costs, in padded prompt tokens: a pass's fixed cost, which makes a run per prompt
# as wasteful as one pass padded to the longest (the calibration: docs/results/sampler/history.md, fourth
# figures).
PREFILL_PASS_COST = 64


def length_buckets(lengths: list[int], pass_cost: int = PREFILL_PASS_COST) -> list[list[int]]:
    """Split prompts into runs of similar length, one prompt pass each, minimising the tokens computed: each
    run pads to its longest prompt, and each pass costs `pass_cost` tokens more. Exact, by dynamic programming
    over the prompts sorted longest first (a run is contiguous in that order). Returns indices into
    `lengths`."""
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

    Prompts of a generation batch differ in length (64 GSM8K prompts: 148 tokens on average, 215 the longest),
    and one padded pass computes the padding too (quadratically in attention). The pass runs instead once per
    run of similar lengths (`length_buckets`), each cut to its own longest prefix, and the runs' keys and
    values are placed back into one left-padded cache. Runs in `dtype` (autocast: bf16 matmuls on f32 weights)
    so a bf16 sampler does not spend its prompt pass at f32 speed."""
    from transformers import DynamicCache

    lengths = prefix_mask.sum(-1)
    runs = length_buckets(lengths.tolist())
    if len(runs) == 1:
        runs = [
            list(range(prefix_ids.shape[0]))
        ]  # one pass, rows in their own order (the cache is returned as is)
    width, parts = prefix_ids.shape[1], []
    with torch.autocast(prefix_ids.device.type, dtype=dtype, enabled=dtype != model.dtype):
        for run in runs:
            index = torch.tensor(run, device=prefix_ids.device)
            cut = (
                width if len(runs) == 1 else max(1, int(lengths[index].max()))
            )  # keep a 1-token prompt's column
            ids, mask = prefix_ids[index, width - cut :], prefix_mask[index, width - cut :]
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            cache = model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
            ).past_key_values
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


SHARED_PREFIX_MIN_TOKENS = 16  # a common start shorter than this is computed with each prompt


def _shared_length(sequences: list[torch.Tensor]) -> int:
    """How many leading tokens all of `sequences` have in common."""
    shortest = min(sequence.numel() for sequence in sequences)
    if shortest == 0:
        return 0
    stacked = torch.stack([sequence[:shortest] for sequence in sequences])
    differs = (stacked != stacked[:1]).any(0).nonzero()
    return int(differs[0]) if differs.numel() else shortest


class PrefixCache:
    """Keys and values of recent prompts' prefixes (one row each, float per layer), so that prompts that begin
    alike (an endpoint's requests in one template: a system prompt, the DAPO instruction) compute their common
    beginning once, across calls. An entry serves any prompt that shares at least SHARED_PREFIX_MIN_TOKENS of
    its first tokens: attention is causal, so the first k slots of a prefix's cache are the cache of its first
    k tokens. The `capacity` most recently stored entries are kept. It serves the stepper on torch's ops
    (`cached_prefill`) and the fused kernels' packed prompt pass (`LeanStepper._packed_prefill`) alike: (H_kv,
    tokens, D) per layer."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self.entries: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def match(self, rows: list[torch.Tensor]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(k, per-layer (keys, values) of the entry) with k the most leading tokens an entry shares with
        every row; (0, None) when none shares SHARED_PREFIX_MIN_TOKENS."""
        best, found = 0, None
        for tokens, layers in self.entries:
            shared = _shared_length([tokens, *rows])
            if shared > best:
                best, found = shared, layers
        return (best, found) if best >= SHARED_PREFIX_MIN_TOKENS else (0, None)

    def beginning(
        self, rows: list[torch.Tensor]
    ) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(k, the entry's layers) for the leading tokens `rows` share with an entry; else (k, None) for those
        they share with each other; (0, None) when fewer than SHARED_PREFIX_MIN_TOKENS."""
        common, stored = self.match(rows)
        if stored is None:
            common = _shared_length(rows) if len(rows) > 1 else 0
        return (common, stored) if common >= SHARED_PREFIX_MIN_TOKENS else (0, None)

    def store(self, tokens: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.entries = [entry for entry in self.entries if not torch.equal(entry[0], tokens)]
        self.entries = [(tokens, layers), *self.entries][: self.capacity]


@torch.no_grad()
def cached_prefill(
    model, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, dtype: torch.dtype, prefix_cache: PrefixCache
):
    """`prefill` for prompts that begin alike: their common beginning (found in `prefix_cache`, else common to
    the prompts themselves) is computed once, then each prompt's remainder attends to it; the first prompt's
    cache is stored for later calls. Returns (cache, mask) in the layout [common beginning | left-padded
    remainders], the mask marking the padding between the two; the plain `prefill` layout when no beginning of
    SHARED_PREFIX_MIN_TOKENS is shared. Prompts in one template share most of their tokens, so most of them
    skip the model, and a prompt that joins later computes only its own."""
    from transformers import DynamicCache

    real = prefix_mask.bool()
    rows = [ids[mask] for ids, mask in zip(prefix_ids, real, strict=True)]
    common, stored = prefix_cache.beginning(rows)
    if common == 0:
        cache, mask = prefill(model, prefix_ids, prefix_mask, dtype), prefix_mask
    else:
        count = len(rows)
        rest_len = [row.numel() - common for row in rows]
        rest_width = max(rest_len)
        rest_ids = prefix_ids.new_zeros(count, rest_width)
        rest_mask = prefix_mask.new_zeros(count, rest_width)
        for index, (row, length) in enumerate(zip(rows, rest_len, strict=True)):
            if length:
                rest_ids[index, rest_width - length :] = row[common:]
                rest_mask[index, rest_width - length :] = 1
        mask = torch.cat([prefix_mask.new_ones(count, common), rest_mask], dim=1)
        with torch.autocast(prefix_ids.device.type, dtype=dtype, enabled=dtype != model.dtype):
            if stored is None:
                cache = model(
                    input_ids=rows[0][None, :common], use_cache=True, logits_to_keep=1
                ).past_key_values
                cache.batch_repeat_interleave(count)
            else:
                cache = DynamicCache()
                for layer, (keys, values) in enumerate(stored):
                    cache.update(
                        keys[None, :, :common].expand(count, -1, -1, -1).contiguous(),
                        values[None, :, :common].expand(count, -1, -1, -1).contiguous(),
                        layer,
                    )
            if rest_width:
                positions = common + (rest_mask.cumsum(-1) - 1).clamp(min=0)
                cache = model(
                    input_ids=rest_ids,
                    attention_mask=mask,
                    position_ids=positions,
                    past_key_values=cache,
                    use_cache=True,
                    logits_to_keep=1,
                ).past_key_values
    first = mask[0].bool()
    prefix_cache.store(
        rows[0], [(layer.keys[0][:, first], layer.values[0][:, first]) for layer in cache.layers]
    )
    return cache, mask
