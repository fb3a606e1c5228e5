"""One decode step at a time for `sampling.sample_tokens`: a static KV cache and a lean forward pass.

On a CPU, decoding the embedded model one token at a time is bound by memory traffic and Python overhead, not
arithmetic. transformers' own step (`HFStepper`) grows its KV cache with `torch.cat` on every step, so each step
copies the whole cache once per layer (at 64 rows x 300 tokens that is ~0.9 GB per step, more than the weights),
and runs ~70 module calls per layer. `LeanStepper` preallocates the cache once (keys and values of every layer
in one tensor, so dropping finished rows moves each kept row once), fuses the q/k/v and gate/up projections into
one matmul each, and runs the Llama block as a handful of tensor operations. It is used for the architectures in
`LEAN_ARCHITECTURES`; any other model decodes through `HFStepper`.

On a CPU, in float32 everywhere and in bfloat16 where the CPU has avx512_bf16, the lean stepper's weights are
packed once for the fused kernels' own matmul (`Projection`), and everything between the projections runs in the
fused kernels of `fused_step` (RoPE, cache writes, attention over each row's valid positions, residual adds,
RMSNorm, SiLU x up), the layer loop in one call per step. Its prompt pass is its own too
(`LeanStepper._packed_prefill`): all prompt tokens packed without padding through the same layers, each attending
to its own prompt. Elsewhere (bf16 without avx512_bf16, no C++ compiler, a GPU) the prompt runs through
transformers' forward (`prefill`, in runs of similar length) and the lean step through torch's ops.

Measured in `benchmarks/sampler_bound.py` and `benchmarks/vs_vllm.py`; in float32 the tokens are transformers' for
a seed and the log-probs equal theirs to 1e-4 (on either path), and the bf16 kernels equal their float32
references within bf16 rounding (tests/test_sampler.py).
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Protocol

import torch
import torch.nn.functional as F

from dapo_suite.inference.fused_step import kernels
from dapo_suite.inference.models import merged_weight

# model_type -> whether its attention projections carry biases (Qwen2: q, k and v do). Both are the plain
# pre-norm Llama block with default RoPE; models with other RoPE scalings fall back to HFStepper.
LEAN_ARCHITECTURES = {"llama": False, "qwen2": True}


class Stepper(Protocol):
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, (B,) at positions (B,); return the next-token logits (B, V): float32, or bf16 from
        the fused bf16 step (exact in float32; `sampling.next_tokens` takes either)."""

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows `keep` (indices into the current batch)."""


class HFStepper:
    """transformers' own forward with its dynamic cache (the reference the lean path is tested against)."""

    def __init__(self, model, cache, attention_mask: torch.Tensor) -> None:
        self.model, self.cache, self.mask = model, cache, attention_mask

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=self.mask,
                            position_ids=positions.unsqueeze(-1), past_key_values=self.cache,
                            use_cache=True).logits[:, -1].float()
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=-1)
        return logits

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]


class Projection:
    """x W^T + b for a weight that stays fixed while the stepper lives.

    Given the fused kernels (`fused_step.kernels()`), the weight is packed once for their `linear` and only the
    packed copy is kept. In bf16 (a CPU with avx512_bf16: blocks of 48 outputs in pair order), at the row counts
    the decoder runs, it is 1.3-1.7x oneDNN's linear and 2-3.8x aten's at 1-64 rows (a decode step), 1.04x and
    1.2x at 2048 (a prompt pass's chunk) on a CPU without AMX (benchmarks/projections.py); with AMX, `linear`
    runs 8-64 rows on the tile unit over the same packed weight (`TILE_MIN_ROWS`), and from 65 rows (a prompt
    pass) oneDNN's tile matmul, so there the weight is also kept in oneDNN's blocked layout (`ONEDNN_MIN_ROWS`).
    In float32, blocks of the CPU's vector width times its tile. A weight it cannot pack (bf16: outputs % 16,
    inputs % 2; float32: outputs % the vector width), and any other dtype or device, uses `F.linear`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 kernels: ModuleType | None = None) -> None:
        packed = kernels.pack_weight(weight) if kernels is not None else weight.new_empty(0)
        self.kernels = kernels if packed.numel() else None
        self.weight = packed if packed.numel() else weight
        # on an AMX CPU the bf16 weight is also kept in oneDNN's layout: from ONEDNN_MIN_ROWS rows `linear` runs
        # oneDNN on it (reordered once here: on the weight as given, oneDNN would reorder it on every call). The
        # layout is picked for 64 rows; it gives the same bits at any row count.
        keep_onednn = self.kernels is not None and weight.dtype == torch.bfloat16 and kernels.ONEDNN_MIN_ROWS > 0
        self.onednn = (torch.ops.mkldnn._reorder_linear_weight(weight, 64) if keep_onednn
                       else weight.new_empty(0))
        # `linear` takes "no bias" as an empty tensor, made once (a slice per call costs ~10 us)
        self.bias = weight.new_empty(0) if bias is None and self.kernels is not None else bias

    @property
    def packed(self) -> bool:
        """Whether the fused `linear` applies it (the fused layer loop needs every layer's weights packed)."""
        return self.kernels is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.linear(x.contiguous(), self.weight, self.bias, self.onednn)
        return F.linear(x, self.weight, self.bias)


def lean_supported(model) -> bool:
    """Whether `LeanStepper` implements this model's block exactly (plain Llama/Qwen2 block, default RoPE)."""
    config = model.config
    rope = getattr(config, "rope_parameters", None) or {}
    return (config.model_type in LEAN_ARCHITECTURES and rope.get("rope_type", "default") == "default"
            and not getattr(config, "use_sliding_window", False) and config.hidden_act == "silu")


def merge_attention(out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor,
                    lse_b: torch.Tensor) -> torch.Tensor:
    """Softmax attention over the union of two disjoint key sets, from each set's output and log-sum-exp of its
    scores (the split-KV merge of FlashDecoding, Dao et al. 2023; Juravsky et al., Hydragen, arXiv 2402.05099):
        lse = log(e^lse_a + e^lse_b),   out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
    out_*: (..., D); lse_*: (...) in float32."""
    lse = torch.logaddexp(lse_a, lse_b)
    merged = out_a * (lse_a - lse).exp().unsqueeze(-1) + out_b * (lse_b - lse).exp().unsqueeze(-1)
    return merged.to(out_a.dtype)


# Attention that also returns the log-sum-exp of the scores, which `merge_attention` needs. The public
# scaled_dot_product_attention returns the output only; this is the same CPU kernel it dispatches to.
_attention_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def sdpa_with_lse(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """`attention_with_lse` by PyTorch's CPU flash-attention kernel (what F.scaled_dot_product_attention runs)."""
    return _attention_with_lse(q, keys, values, attn_mask=bias, scale=scale)[:2]


# What one more prompt pass costs, in padded prompt tokens. Measured (bf16, 2 threads, the first 64 GSM8K prompts:
# 148 tokens on average, 215 the longest): one padded pass 8.06 s; in runs, 4.49 s at 256 (4 runs), 4.36 s at 64
# (7 runs), 4.50 s at 16 (14 runs). 16 prompts: 1.37 s in one pass, 1.09 s at 64 (3 runs).
PREFILL_PASS_COST = 64
# The lean stepper's packed prompt pass runs at most this many tokens at once (whole prompts): rows enough for
# the projections to run near the matmul peak, outputs small enough to stay in cache (bf16 gate/up projection:
# 902 GFLOP/s at 2048 rows, 717 at 8192; the 64 GSM8K prompts' pass 3.8 -> 2.8 s).
PREFILL_CHUNK_TOKENS = 2048
# The head sizes `attend` is compiled for (csrc/decode_step.cpp); other models decode with torch's ops.
FUSED_HEAD_DIMS = (64, 128)


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


SHARED_PREFIX_MIN_TOKENS = 16  # a common start shorter than this is computed with each prompt
JOIN_HEADROOM_SLOTS = 128  # spare slots of a rebuilt cache: rows may join in place for this many steps


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
    beginning once, across calls. An entry serves any prompt that shares at least SHARED_PREFIX_MIN_TOKENS of its
    first tokens: attention is causal, so the first k slots of a prefix's cache are the cache of its first k tokens.
    The `capacity` most recently stored entries are kept. It serves the stepper on torch's ops; with the fused
    kernels (float32 on any CPU, bf16 with avx512_bf16) the packed prompt pass runs instead."""

    def __init__(self, capacity: int = 8) -> None:
        self.capacity = capacity
        self.entries: list[tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]] = []

    def match(self, rows: list[torch.Tensor]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(k, per-layer (keys, values) of the entry) with k the most leading tokens an entry shares with every
        row; (0, None) when none shares SHARED_PREFIX_MIN_TOKENS."""
        best, found = 0, None
        for tokens, layers in self.entries:
            shared = _shared_length([tokens, *rows])
            if shared > best:
                best, found = shared, layers
        return (best, found) if best >= SHARED_PREFIX_MIN_TOKENS else (0, None)

    def store(self, tokens: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        self.entries = [entry for entry in self.entries if not torch.equal(entry[0], tokens)]
        self.entries = [(tokens, layers), *self.entries][: self.capacity]


@torch.no_grad()
def cached_prefill(model, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor, dtype: torch.dtype,
                   prefix_cache: PrefixCache):
    """`prefill` for prompts that begin alike: their common beginning (found in `prefix_cache`, else common to the
    prompts themselves) is computed once, then each prompt's remainder attends to it; the first prompt's cache is
    stored for later calls. Returns (cache, mask) in the layout [common beginning | left-padded remainders], the
    mask marking the padding between the two; the plain `prefill` layout when no beginning of
    SHARED_PREFIX_MIN_TOKENS is shared. 16 DAPO-template prompts of ~95 tokens share ~85: ~6x fewer tokens
    through the model, and a prompt that joins later computes only its ~10 own tokens."""
    from transformers import DynamicCache

    real = prefix_mask.bool()
    rows = [ids[mask] for ids, mask in zip(prefix_ids, real, strict=True)]
    common, stored = prefix_cache.match(rows)
    if stored is None and len(rows) > 1:
        common = _shared_length(rows)
    if common < SHARED_PREFIX_MIN_TOKENS:
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
                cache = model(input_ids=rows[0][None, :common], use_cache=True, logits_to_keep=1).past_key_values
                cache.batch_repeat_interleave(count)
            else:
                cache = DynamicCache()
                for layer, (keys, values) in enumerate(stored):
                    cache.update(keys[None, :, :common].expand(count, -1, -1, -1).contiguous(),
                                 values[None, :, :common].expand(count, -1, -1, -1).contiguous(), layer)
            if rest_width:
                positions = common + (rest_mask.cumsum(-1) - 1).clamp(min=0)
                cache = model(input_ids=rest_ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                              use_cache=True, logits_to_keep=1).past_key_values
    first = mask[0].bool()
    prefix_cache.store(rows[0], [(layer.keys[0][:, first], layer.values[0][:, first]) for layer in cache.layers])
    return cache, mask


class StepperWeights:
    """The lean stepper's weights: a snapshot of the model's, in the sampling dtype, q/k/v and gate/up fused, each
    projection packed for the fused kernels' `linear` where they apply (`Projection`).

    Building one reads and rewrites every weight: for the embedded model ~0.2 s in bf16 and ~0.4 s in float32 on an
    AMD EPYC, against ~1.8 s and ~3.3 s for a whole one-prompt, 200-token `sample_tokens` call. A caller whose weights stay fixed across calls builds it once and passes it
    on (`HFEngine` until its `sync_weights`, the endpoint's `BatchDecoder` for its life); a change to the model's
    weights after that is not seen until a new snapshot is made. Every tensor in it is a copy (`.to(dtype)` of a
    tensor already in that dtype would be the model's own), so an update in place leaves a snapshot whole."""

    def __init__(self, model, dtype: torch.dtype | None = None) -> None:
        config, inner = model.config, model.model
        dtype = self.dtype = dtype or model.dtype
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # On a CPU: the fused kernels (`fused_step`) in float32 everywhere and in bf16 where the CPU has bf16 dot
        # products; elsewhere SDPA and aten's ops, what transformers runs
        fused = (kernels() if dtype in (torch.float32, torch.bfloat16) and inner.embed_tokens.weight.device.type == "cpu"
                 and head_dim in FUSED_HEAD_DIMS else None)
        self.kernels = fused if fused is not None and (dtype == torch.float32 or fused.NATIVE_BF16) else None
        own = functools.partial(torch.Tensor.to, copy=True)  # a copy even where the dtype is the model's
        # LoRA layers (PEFT) are read with their adapters merged: the snapshot samples at the plain model's speed
        weight = merged_weight
        self.embed, self.final_norm = own(weight(inner.embed_tokens), dtype), own(inner.norm.weight, torch.float32)
        tied = model.lm_head.weight is inner.embed_tokens.weight
        self.lm_head = Projection(self.embed if tied else own(weight(model.lm_head), dtype), kernels=self.kernels)
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_bias = None
            if LEAN_ARCHITECTURES[config.model_type]:
                qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).to(dtype)
            self.layers.append((
                own(layer.input_layernorm.weight, torch.float32),
                Projection(torch.cat([weight(attn.q_proj), weight(attn.k_proj), weight(attn.v_proj)]).to(dtype),
                           qkv_bias, self.kernels),
                Projection(own(weight(attn.o_proj), dtype), kernels=self.kernels),
                own(layer.post_attention_layernorm.weight, torch.float32),
                Projection(torch.cat([weight(mlp.gate_proj), weight(mlp.up_proj)]).to(dtype), kernels=self.kernels),
                Projection(own(weight(mlp.down_proj), dtype), kernels=self.kernels),
            ))
        if not all(p.packed for _, qkv, o, _, gate_up, down in self.layers for p in (qkv, o, gate_up, down)):
            self.kernels = None  # a width `linear` cannot pack: the layers run on torch's ops
        self.layer_tensors: list[list[torch.Tensor]] = []
        if self.kernels is not None:
            # the fused layer loop's weights: each layer's, and the norm its MLP half ends with (the next layer's
            # input norm, or the final one)
            norms_after = [layer[0] for layer in self.layers[1:]] + [self.final_norm]
            self.layer_tensors = [
                [norm_in, qkv.weight, qkv.bias, o.weight, norm_post, gate_up.weight, down.weight, norm_after,
                 qkv.onednn, o.onednn, gate_up.onednn, down.onednn]
                for (norm_in, qkv, o, norm_post, gate_up, down), norm_after in zip(self.layers, norms_after,
                                                                                   strict=True)]


class LeanStepper:
    """Decode steps for a Llama-style model with a preallocated cache.

    Per layer (pre-norm; RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)):
        q, k, v = split(RMSNorm(h) W_qkv^T);  q, k = RoPE(q, pos), RoPE(k, pos)
        h = h + Attn(q, K[:t], V[:t]) W_o^T;  g, u = split(RMSNorm(h) W_gu^T);  h = h + (silu(g) * u) W_down^T
    Grouped-query attention reads K and V once per key/value head: the H/H_kv query heads of a group are folded
    into the query axis, (B, H, D) -> (B, H_kv, H/H_kv, D), exactly as `models.grouped_query_sdpa` does.

    With `group_size` G > 1 (the G samples of a prompt, rows i*G .. i*G+G-1), the prompt's keys and values are
    stored once. With torch's ops the group's queries attend to the prompt together (one attention with G times
    the query rows), each row attends to its own tokens, and the two parts are merged by `merge_attention`; the
    fused `attend` reads the prompt, then the row's own keys, in one softmax, the group's rows one after another
    (the prompt stays in cache between them). On a CPU, decode attention is bound by reading the cache, so with a
    200-token prompt and G = 8 this reads the prompt from memory 8x less. With G = 1 the prompt sits in each
    row's own cache.
    """

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 dtype: torch.dtype | None = None, group_size: int = 1,
                 prefix_cache: PrefixCache | None = None, weights: StepperWeights | None = None) -> None:
        config, inner = model.config, model.model
        dtype = dtype or model.dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        rotary = inner.rotary_emb
        self.inv_freq, self.rope_scale = rotary.inv_freq.float(), rotary.attention_scaling
        # The residual stream and the RMSNorms stay in float32 whatever the sampling dtype; only the projections'
        # inputs are cast down. That is what the trainer's autocast computes (so the sampler's log-probs stay close
        # to its recomputation), and RMSNorm in float32 is cheaper than in bf16 (which upcasts and casts back).
        self.dtype = dtype
        if weights is None:
            weights = StepperWeights(model, dtype)
        elif weights.dtype != dtype:
            raise ValueError(f"the weights snapshot is in {weights.dtype}, the stepper samples in {dtype}")
        self.kernels, self.embed, self.final_norm = weights.kernels, weights.embed, weights.final_norm
        self.lm_head, self.layers = weights.lm_head, weights.layers
        self.layer_tensors = weights.layer_tensors
        self.scale = self.head_dim ** -0.5
        # The keys and values of each prompt's prefix (its tokens but the last, which the first step feeds), each
        # prompt once, left-padded to P slots; `attention_mask` is (prompts, P + 1).
        self.prefix_cache = prefix_cache if self.kernels is None else None
        prompts = input_ids.shape[0]
        prompt_kv, prompt_bias, prompt_start = self._prefix(model, input_ids, attention_mask)
        prompt_len = prompt_kv.shape[4]
        # A prompt of one token has no cached prefix, and the kernel gives a fully masked prefix weight e^0: share
        # only when every prompt has one.
        self.shared = group_size > 1 and bool(attention_mask[:, :-1].any(-1).all())
        own_len = max_new_tokens if self.shared else prompt_len + max_new_tokens
        # Each row's own keys and values of every layer in one buffer: (2, layers, rows, H_kv, slots, D), so
        # dropping finished rows is one index_select.
        self.kv = torch.empty(2, len(self.layers), prompts * group_size, self.kv_heads, own_len, self.head_dim,
                              dtype=dtype, device=attention_mask.device)
        self.bias = torch.zeros(prompts * group_size, 1, 1, own_len, dtype=dtype, device=attention_mask.device)
        if self.shared:
            self.prompt_kv, self.prompt_bias = prompt_kv, prompt_bias
            self.row_prompt = torch.arange(prompts, device=attention_mask.device).repeat_interleave(group_size)
            self.prompt_start = prompt_start
            self._group_layout()
            self.length = 0  # own slots filled so far
            self.start = torch.zeros(prompts * group_size, dtype=torch.long, device=attention_mask.device)
        else:
            self._kv_store = self.kv  # the buffer `add_rows` writes joining rows into (its spare rows, once rebuilt)
            self.kv[:, :, :, :, :prompt_len] = prompt_kv.repeat_interleave(group_size, dim=2)
            self.bias[:, :, :, :prompt_len] = prompt_bias.repeat_interleave(group_size, dim=0)
            self.length = prompt_len
            self.start = prompt_start.repeat_interleave(group_size)

    def _prefix(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """(keys and values of each prompt's prefix (2, layers, prompts, H_kv, W, D), their attention bias
        (prompts, 1, 1, W), the first real slot of each) for left-padded prompts (prompts, P + 1); W = P, or with
        a `prefix_cache` the width of `cached_prefill`'s layout."""
        prefix_ids, prefix_mask = input_ids[:, :-1], attention_mask[:, :-1]
        if prefix_ids.shape[1] == 0:  # one-token prompts: nothing before the token the first step feeds
            prompt_kv = torch.zeros(2, len(self.layers), input_ids.shape[0], self.kv_heads, 0, self.head_dim,
                                    dtype=self.dtype, device=input_ids.device)
        elif self.kernels is not None:
            prompt_kv = self._packed_prefill(prefix_ids, prefix_mask)
        else:
            if self.prefix_cache is not None:
                cache, prefix_mask = cached_prefill(model, prefix_ids, prefix_mask, self.dtype, self.prefix_cache)
            else:
                cache = prefill(model, prefix_ids, prefix_mask, self.dtype)
            prompt_kv = torch.stack([torch.stack([layer.keys, layer.values]) for layer in cache.layers], 1)
            prompt_kv = prompt_kv.to(self.dtype)
        width = prefix_mask.shape[1]
        prompt_bias = torch.zeros(input_ids.shape[0], 1, 1, width, dtype=self.dtype, device=input_ids.device)
        prompt_bias.masked_fill_(~prefix_mask[:, None, None, :].bool(), float("-inf"))
        return prompt_kv, prompt_bias, width - prefix_mask.long().sum(-1)

    def add_rows(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 capacity_rows: int | None = None) -> None:
        """Join new prompts (left-padded, one row each) to the running rows, after them: continuous batching.

        Every row's filled slots end at the same slot (the running rows' prompts and tokens so far; the new
        prompts' prefixes), so the next `step` writes all of them at one slot; a row's RoPE positions are its own
        (the caller's `positions`), so where its keys sit in the buffer changes nothing but the padding. Only the
        new prompts run through the model: restarting the batch would recompute every running row's prompt and
        tokens. The new rows are written in place when the buffer has spare rows and slots and their prefixes fit
        before the current slot; else the buffer is rebuilt with spare rows (up to `capacity_rows`, default twice
        the rows) and JOIN_HEADROOM_SLOTS spare slots, so that the following joins are written in place (a rebuild
        copies every running row's cache: at 64 rows of ~300 tokens, ~0.9 GB). Not with a shared prompt cache
        (`group_size` > 1)."""
        if self.shared:
            raise ValueError("add_rows needs the per-row cache layout (group_size 1)")
        new_kv, new_bias, new_start = self._prefix(model, input_ids, attention_mask)
        running, added, prefix_len = self.kv.shape[2], input_ids.shape[0], new_kv.shape[4]
        store = self._kv_store
        in_place = (prefix_len <= self.length and running + added <= store.shape[2]
                    and self.length + max_new_tokens <= store.shape[4])
        end = self.length if in_place else max(self.length, prefix_len)  # where every row's filled slots end
        shift = end - self.length
        if not in_place:
            slots = end + max(self.kv.shape[4] - self.length, max_new_tokens) + JOIN_HEADROOM_SLOTS
            rows = max(running + added, capacity_rows or 2 * (running + added))
            store = self.kv.new_empty(2, len(self.layers), rows, self.kv_heads, slots, self.head_dim)
            store[:, :, :running, :, :shift] = 0.0  # padding is read (masked): it must hold finite values
            store[:, :, :running, :, shift:end] = self.kv[:, :, :, :, : self.length]
            bias = self.bias.new_full((running, 1, 1, slots), float("-inf"))
            bias[:, :, :, shift:end] = self.bias[:, :, :, : self.length]
            bias[:, :, :, end:] = 0.0
            self.bias, self._kv_store = bias, store
        joined = store[:, :, running : running + added]
        joined[:, :, :, :, : end - prefix_len] = 0.0
        joined[:, :, :, :, end - prefix_len : end] = new_kv
        bias = self.bias.new_full((added, 1, 1, store.shape[4]), float("-inf"))
        bias[:, :, :, end - prefix_len : end] = new_bias
        bias[:, :, :, end:] = 0.0  # the slots the coming steps fill
        self.kv, self.bias, self.length = store[:, :, : running + added], torch.cat([self.bias, bias]), end
        self.start = torch.cat([self.start + shift, new_start + end - prefix_len])

    def _group_layout(self) -> None:
        """Where each row's queries go in the (prompts, widest group) grid the shared-prefix attention runs on;
        rows stay ordered by prompt, so a row's rank in its group is its index minus its group's first index."""
        counts = torch.bincount(self.row_prompt, minlength=self.prompt_kv.shape[2])
        self.width = int(counts.max())
        first = counts.cumsum(0) - counts
        rank = torch.arange(self.row_prompt.numel(), device=counts.device) - first[self.row_prompt]
        self.slots = self.row_prompt * self.width + rank

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin

    def _norm(self, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # one fused op; in float32 it equals transformers' LlamaRMSNorm bit for bit (tests/test_sampler.py)
        return F.rms_norm(hidden, weight.shape, weight, self.eps).to(self.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return ((angles.cos() * self.rope_scale).to(dtype)[:, None, :],
                (angles.sin() * self.rope_scale).to(dtype)[:, None, :])

    def _attend(self, index: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        """q (B, H_kv, H/H_kv, D) against the row's own cache and, when shared, its prompt's."""
        own, own_lse = sdpa_with_lse(q, keys[index], values[index], bias, self.scale)
        if not self.shared:
            return own
        batch, kv_heads, fold, dim = q.shape
        prompts = self.prompt_kv.shape[2]
        grid = q.new_zeros(prompts * self.width, kv_heads, fold, dim)
        grid[self.slots] = q
        grid = grid.view(prompts, self.width, kv_heads, fold, dim).transpose(1, 2)
        out, lse = sdpa_with_lse(grid.reshape(prompts, kv_heads, self.width * fold, dim),
                                 self.prompt_kv[0, index], self.prompt_kv[1, index], self.prompt_bias, self.scale)
        out = out.view(prompts, kv_heads, self.width, fold, dim).transpose(1, 2).reshape(-1, kv_heads, fold, dim)
        lse = lse.view(prompts, kv_heads, self.width, fold).transpose(1, 2).reshape(-1, kv_heads, fold)
        return merge_attention(own, own_lse, out[self.slots], lse[self.slots])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self._fused_step(tokens, positions)
        batch, slot = tokens.shape[0], self.length
        self.length += 1
        cos, sin = self._rope(positions, self.dtype)
        bias = self.bias[:, :, :, : self.length]  # (B, 1, 1, t)
        keys, values = self.kv[0, :, :, :, : self.length], self.kv[1, :, :, :, : self.length]
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        hidden = F.embedding(tokens, self.embed).float()
        heads_qk = self.heads + self.kv_heads
        for index, (norm_in, qkv_proj, o_proj, norm_post, gate_up_proj, down_proj) in enumerate(self.layers):
            qkv = qkv_proj(self._norm(hidden, norm_in))
            # queries and keys rotate together: one RoPE for both instead of one each
            qk = self._rotate(qkv[:, : q_size + kv_size].view(batch, heads_qk, self.head_dim), cos, sin)
            self.kv[0, index, :, :, slot] = qk[:, self.heads :]
            self.kv[1, index, :, :, slot] = qkv[:, q_size + kv_size :].view(batch, self.kv_heads, self.head_dim)
            q = qk[:, : self.heads].view(batch, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
            attended = self._attend(index, q, keys, values, bias)
            hidden = hidden + o_proj(attended.reshape(batch, q_size))
            gate, up = gate_up_proj(self._norm(hidden, norm_post)).chunk(2, dim=-1)
            hidden = hidden + down_proj(F.silu(gate) * up)
        return self.lm_head(self._norm(hidden, self.final_norm)).float()

    def _fused_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`step` through the fused kernels: per layer four projections and four kernel calls."""
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        x = self._fused_layers(tokens, positions, rows, torch.full_like(rows, self.length), self.kv, self.start,
                               self.prompt_kv if self.shared else None)
        self.length += 1
        # in the sampling dtype: the fused sampler reads bf16 as it is (a float32 copy of 64 rows x 49k logits
        # cost 2-4 ms of a 130 ms step)
        return self.lm_head(x)

    def _fused_layers(self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, slots: torch.Tensor,
                      cache: torch.Tensor, cache_start: torch.Tensor, prompt_kv: torch.Tensor | None) -> torch.Tensor:
        """Every layer for N tokens (each at its cache row and slot), in one call of the fused kernels' layer loop
        (`run_layers`: per layer four projections, `attend`, `add_rms_norm` twice, `silu_mul`). Writes their keys
        and values into `cache`; returns the final norm of the residual stream, (N, C) in the sampling dtype."""
        cos, sin = (part.squeeze(1).contiguous() for part in self._rope(positions, torch.float32))
        empty = cache.new_empty(0)
        shared = (prompt_kv, self.prompt_start, self.row_prompt) if prompt_kv is not None else (empty, rows, rows)
        return self.kernels.run_layers(F.embedding(tokens, self.embed).float(), self.layer_tensors, cos, sin, rows,
                                       slots, cache, cache_start, *shared, self.heads, self.scale, self.eps)

    def _packed_prefill(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor) -> torch.Tensor:
        """The prompts' keys and values, (2, layers, prompts, H_kv, width, D), left-padded (zeros in the padding),
        from one pass over their tokens packed without padding: the projections run on all real tokens at once,
        and each token attends to its own prompt only (the fused `attend`, one query per token). In chunks of
        whole prompts (PREFILL_CHUNK_TOKENS) to bound the activations' memory."""
        prompts, width = prefix_ids.shape
        kv = torch.zeros(2, len(self.layers), prompts, self.kv_heads, width, self.head_dim, dtype=self.dtype,
                         device=prefix_ids.device)
        real = prefix_mask.bool()
        lengths = real.sum(-1)
        start = width - lengths
        row_of, slot_of = real.nonzero(as_tuple=True)  # row-major: each prompt's tokens together, in order
        tokens, positions = prefix_ids[row_of, slot_of], slot_of - start[row_of]
        first = previous = 0
        for end in lengths.cumsum(0).tolist() + [None]:  # close a chunk before the prompt that would overflow it
            if previous > first and (end is None or end - first > PREFILL_CHUNK_TOKENS):
                part = slice(first, previous)
                self._fused_layers(tokens[part], positions[part], row_of[part], slot_of[part], kv, start, None)
                first = previous
            previous = end
        return kv

    def select(self, keep: torch.Tensor) -> None:
        # Compacted in place, filled slots only: row keep[i] moves to row i, in ascending i (keep is sorted, so
        # keep[i] >= i and no row is overwritten before it has moved). index_select copied every slot of every
        # kept row, the empty tail too: 0.42 s of a 9.5 s run of 64 rows x 256 tokens.
        for row, source in enumerate(keep.tolist()):
            if row != source:
                self.kv[:, :, row, :, : self.length] = self.kv[:, :, source, :, : self.length]
        self.kv = self.kv[:, :, : keep.numel()]  # each layer's (rows, H_kv, slots, D) block stays contiguous
        self.bias, self.start = self.bias[keep], self.start[keep]
        if not self.shared:
            return
        self.row_prompt = self.row_prompt[keep]
        alive = torch.unique(self.row_prompt)  # sorted
        if alive.numel() < self.prompt_kv.shape[2]:  # whole groups finished: stop reading their prompts
            self.prompt_kv, self.prompt_bias = self.prompt_kv.index_select(2, alive), self.prompt_bias[alive]
            self.prompt_start = self.prompt_start[alive]
            self.row_prompt = torch.searchsorted(alive, self.row_prompt)
        self._group_layout()


def make_stepper(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int,
                 dtype: torch.dtype | None = None, decoder: str = "auto", group_size: int = 1,
                 prefix_cache: PrefixCache | None = None, weights: StepperWeights | None = None) -> Stepper:
    """A stepper that has run the prompts (left-padded, each once) up to their last token, which its first step
    takes: the lean stepper where it implements the model exactly ("auto"), else, or with "hf", transformers' own
    (which samples in the model's dtype: `dtype` needs the lean stepper). It decodes `group_size` rows per prompt
    (rows i*G .. i*G+G-1 for prompt i). `weights`: the lean stepper's snapshot of the model's weights, made once
    by a caller that samples many times from the same weights (`StepperWeights`); None makes one for this call."""
    if decoder not in ("auto", "hf"):
        raise ValueError(f"decoder {decoder!r}: expected 'auto' or 'hf'")
    if decoder == "auto" and lean_supported(model):
        return LeanStepper(model, input_ids, attention_mask, max_new_tokens, dtype, group_size, prefix_cache, weights)
    cache = prefill(model, input_ids[:, :-1], attention_mask[:, :-1], dtype or model.dtype)
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    return HFStepper(model, cache, attention_mask.repeat_interleave(group_size, 0))
