"""One decode step at a time for `sampling.sample_tokens`: a static KV cache and a lean forward pass.

On a CPU, decoding the embedded model one token at a time is bound by memory traffic and Python overhead, not
arithmetic. transformers' own step (`HFStepper`) grows its KV cache with `torch.cat` on every step, so each
step copies the whole cache once per layer (at 64 rows x 300 tokens that is ~0.9 GB per step, more than the
weights), and runs ~70 module calls per layer. `LeanStepper` preallocates the cache once (keys and values of
every layer in one tensor, so dropping finished rows moves each kept row once), fuses the q/k/v and gate/up
projections into one matmul each, and runs the Llama block as a handful of tensor operations. It is used for
the architectures in `LEAN_ARCHITECTURES` (`lean_refusal`); any other model decodes through `HFStepper`, with
a warning naming why.

On a CPU, in float32 everywhere and in bfloat16 where the CPU has avx512_bf16, the lean stepper's weights are
packed once for the fused kernels' own matmul (`weights.StepperWeights`), and everything between the
projections runs in the fused kernels of `fused_step` (RoPE, cache writes, attention over each row's valid
positions, residual adds, RMSNorm, SiLU x up), the layer loop in one call per step. Its prompt pass is its own
too (`LeanStepper._packed_prefill`): all prompt tokens packed without padding through the same layers, each
attending to its own prompt. Elsewhere (bf16 without avx512_bf16, no C++ compiler, a GPU) the prompt runs
through transformers' forward (`prefill.prefill`, in runs of similar length) and the lean step through torch's
ops.

Measured in `benchmarks/sampler_bound.py` and `benchmarks/vs_vllm.py`; in float32 the tokens are transformers'
for a seed and the log-probs equal theirs to 1e-4 (on either path), and the bf16 kernels equal their float32
references within bf16 rounding (tests/inference/test_sampler.py).
"""

from __future__ import annotations

import warnings
from typing import Protocol

import torch
import torch.nn.functional as F

from dapo_suite.inference.attention import merge_attention, sdpa_with_lse
from dapo_suite.inference.prefill import PrefixCache, cached_prefill, prefill
from dapo_suite.inference.weights import LEAN_ARCHITECTURES, StepperWeights


class Stepper(Protocol):
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, (B,) at positions (B,); return the next-token logits (B, V): float32, or
        bf16 from the fused bf16 step (exact in float32; `sampling.next_tokens` takes either)."""

    def select(self, keep: torch.Tensor) -> None:
        """Keep only the rows `keep` (indices into the current batch)."""


class HFStepper:
    """transformers' own forward with its dynamic cache (the reference the lean path is tested against)."""

    def __init__(self, model, cache, attention_mask: torch.Tensor) -> None:
        self.model, self.cache, self.mask = model, cache, attention_mask

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        logits = (
            self.model(
                input_ids=tokens.unsqueeze(-1),
                attention_mask=self.mask,
                position_ids=positions.unsqueeze(-1),
                past_key_values=self.cache,
                use_cache=True,
            )
            .logits[:, -1]
            .float()
        )
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=-1)
        return logits

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]


def lean_refusal(model) -> str | None:
    """Why `LeanStepper` does not implement this model's block exactly, or None where it does: the pre-norm
    Llama/Qwen2/Qwen3 block, full attention, SiLU, and RoPE frequencies that stay fixed (the lean stepper
    takes the model's own `rotary_emb.inv_freq` and `attention_scaling`, so "llama3", "linear", "yarn" are
    exact)."""
    config = model.config
    if config.model_type not in LEAN_ARCHITECTURES:
        return (
            f"model_type {config.model_type!r} is not one of the lean stepper's "
            f"{', '.join(LEAN_ARCHITECTURES)}"
        )
    rope_type = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if (
        "dynamic" in rope_type or rope_type == "longrope"
    ):  # transformers recomputes these frequencies per length
        return f"rope_type {rope_type!r} changes its frequencies with the sequence length"
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if getattr(config, "use_sliding_window", False) or layer_types != {"full_attention"}:
        return f"sliding-window attention (layer types {', '.join(sorted(layer_types))})"
    if config.hidden_act != "silu":
        return f"hidden_act {config.hidden_act!r} (the lean stepper's MLP is SiLU-gated)"
    if getattr(config, "attention_bias", False) or getattr(
        config, "mlp_bias", False
    ):  # Qwen2's own are q/k/v only
        return "biases on the output or MLP projections (only Qwen2's q/k/v biases are implemented)"
    return None


_WARNED_REFUSALS: set[str] = set()  # each reason is said once per process, not at every call


def lean_supported(model) -> bool:
    """Whether `LeanStepper` implements this model's block exactly (`lean_refusal`); where not, warns once
    with the reason that the model decodes through transformers' step."""
    reason = lean_refusal(model)
    if reason is not None and reason not in _WARNED_REFUSALS:
        _WARNED_REFUSALS.add(reason)
        warnings.warn(
            f"{type(model).__name__} decodes with transformers' step (slower), not the lean stepper: "
            f"{reason}",
            stacklevel=2,
        )
    return reason is None


# The lean stepper's packed prompt pass runs at most this many tokens at once (whole prompts): rows enough for
# the projections to run near the matmul peak, outputs small enough to stay in cache (measured:
# docs/benchmarks.md).
PREFILL_CHUNK_TOKENS = 2048

JOIN_HEADROOM_SLOTS = 128  # spare slots of a rebuilt cache: rows may join in place for this many steps


class LeanStepper:
    """Decode steps for a Llama-style model with a preallocated cache.

    Per layer (pre-norm; RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)):
        q, k, v = split(RMSNorm(h) W_qkv^T + b_qkv);  q, k = RoPE(q, pos), RoPE(k, pos)
        h = h + Attn(q, K[:t], V[:t]) W_o^T;  g, u = split(RMSNorm(h) W_gu^T);  h = h + (silu(g) * u) W_down^T
    b_qkv: Qwen2's biases, else 0; Qwen3 RMSNorms each head of q and k (over D, its q_norm / k_norm) before
    RoPE. RoPE's frequencies and scale are the model's rotary module's (`rotary_emb`: Llama 3's `llama3`
    scaling too). Grouped-query attention reads K and V once per key/value head: the H/H_kv query heads of a
    group are folded into the query axis, (B, H, D) -> (B, H_kv, H/H_kv, D), exactly as
    `models.grouped_query_sdpa` does.

    With `group_size` G > 1 (the G samples of a prompt, rows i*G .. i*G+G-1), the prompt's keys and values are
    stored once. With torch's ops the group's queries attend to the prompt together (one attention with G
    times the query rows), each row attends to its own tokens, and the two parts are merged by
    `merge_attention`; the fused `attend` reads the prompt, then the row's own keys, in one softmax, the
    group's rows one after another (the prompt stays in cache between them). On a CPU, decode attention is
    bound by reading the cache, so with a 200-token prompt and G = 8 this reads the prompt from memory 8x
    less. With G = 1 the prompt sits in each row's own cache.
    """

    def __init__(
        self,
        model,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        dtype: torch.dtype | None = None,
        group_size: int = 1,
        prefix_cache: PrefixCache | None = None,
        weights: StepperWeights | None = None,
    ) -> None:
        config, inner = model.config, model.model
        dtype = dtype or model.dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        rotary = inner.rotary_emb
        self.inv_freq, self.rope_scale = rotary.inv_freq.float(), rotary.attention_scaling
        # The residual stream and the RMSNorms stay in float32 whatever the sampling dtype; only the
        # projections' inputs are cast down. That is what the trainer's autocast computes (so the sampler's
        # log-probs stay close to its recomputation), and RMSNorm in float32 is cheaper than in bf16 (which
        # upcasts and casts back).
        self.dtype = dtype
        if weights is None:
            weights = StepperWeights(model, dtype)
        elif weights.dtype != dtype:
            raise ValueError(f"the weights snapshot is in {weights.dtype}, the stepper samples in {dtype}")
        self.kernels, self.embed, self.final_norm = weights.kernels, weights.embed, weights.final_norm
        self.kv_dtype = weights.kv_dtype  # the activations' dtype, or bf16 under float32 (the fused kernels)
        self.lm_head, self.layers, self.qk_norms = weights.lm_head, weights.layers, weights.qk_norms
        self.layer_tensors = weights.layer_tensors
        self.scale = self.head_dim**-0.5
        # The keys and values of each prompt's prefix (its tokens but the last, which the first step feeds),
        # each prompt once, left-padded to P slots; `attention_mask` is (prompts, P + 1).
        self.prefix_cache = prefix_cache
        prompts = input_ids.shape[0]
        prompt_kv, prompt_bias, prompt_start = self._prefix(model, input_ids, attention_mask)
        prompt_len = prompt_kv.shape[4]
        # A prompt of one token has no cached prefix, and the kernel gives a fully masked prefix weight e^0:
        # share only when every prompt has one.
        self.shared = group_size > 1 and bool(attention_mask[:, :-1].any(-1).all())
        own_len = max_new_tokens if self.shared else prompt_len + max_new_tokens
        # Each row's own keys and values of every layer in one buffer: (2, layers, rows, H_kv, slots, D), so
        # dropping finished rows is one index_select.
        self.kv = torch.empty(
            2,
            len(self.layers),
            prompts * group_size,
            self.kv_heads,
            own_len,
            self.head_dim,
            dtype=self.kv_dtype,
            device=attention_mask.device,
        )
        self.bias = torch.zeros(
            prompts * group_size, 1, 1, own_len, dtype=dtype, device=attention_mask.device
        )
        if self.shared:
            self.prompt_kv, self.prompt_bias = prompt_kv, prompt_bias
            self.row_prompt = torch.arange(prompts, device=attention_mask.device).repeat_interleave(
                group_size
            )
            self.prompt_start = prompt_start
            self._group_layout()
            self.length = 0  # own slots filled so far
            self.start = torch.zeros(prompts * group_size, dtype=torch.long, device=attention_mask.device)
        else:
            self._kv_store = (
                self.kv
            )  # the buffer `add_rows` writes joining rows into (its spare rows, once rebuilt)
            self.kv[:, :, :, :, :prompt_len] = prompt_kv.repeat_interleave(group_size, dim=2)
            self.bias[:, :, :, :prompt_len] = prompt_bias.repeat_interleave(group_size, dim=0)
            self.length = prompt_len
            self.start = prompt_start.repeat_interleave(group_size)

    def _prefix(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """(keys and values of each prompt's prefix (2, layers, prompts, H_kv, W, D), their attention bias
        (prompts, 1, 1, W), the first real slot of each) for left-padded prompts (prompts, P + 1); W = P, or
        with a `prefix_cache` the width of `cached_prefill`'s layout."""
        prefix_ids, prefix_mask = input_ids[:, :-1], attention_mask[:, :-1]
        if prefix_ids.shape[1] == 0:  # one-token prompts: nothing before the token the first step feeds
            prompt_kv = torch.zeros(
                2,
                len(self.layers),
                input_ids.shape[0],
                self.kv_heads,
                0,
                self.head_dim,
                dtype=self.kv_dtype,
                device=input_ids.device,
            )
        elif self.kernels is not None:
            prompt_kv = self._packed_prefill(prefix_ids, prefix_mask)
        else:
            if self.prefix_cache is not None:
                cache, prefix_mask = cached_prefill(
                    model, prefix_ids, prefix_mask, self.dtype, self.prefix_cache
                )
            else:
                cache = prefill(model, prefix_ids, prefix_mask, self.dtype)
            prompt_kv = torch.stack([torch.stack([layer.keys, layer.values]) for layer in cache.layers], 1)
            prompt_kv = prompt_kv.to(self.kv_dtype)
        width = prefix_mask.shape[1]
        prompt_bias = torch.zeros(input_ids.shape[0], 1, 1, width, dtype=self.dtype, device=input_ids.device)
        prompt_bias.masked_fill_(~prefix_mask[:, None, None, :].bool(), float("-inf"))
        return prompt_kv, prompt_bias, width - prefix_mask.long().sum(-1)

    def add_rows(
        self,
        model,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        max_new_tokens: int,
        capacity_rows: int | None = None,
    ) -> None:
        """Join new prompts (left-padded, one row each) to the running rows, after them: continuous batching.

        Every row's filled slots end at the same slot (the running rows' prompts and tokens so far; the new
        prompts' prefixes), so the next `step` writes all of them at one slot; a row's RoPE positions are its
        own (the caller's `positions`), so where its keys sit in the buffer changes nothing but the padding.
        Only the new prompts run through the model: restarting the batch would recompute every running row's
        prompt and tokens. The new rows are written in place when the buffer has spare rows and slots and
        their prefixes fit before the current slot; else the buffer is rebuilt with spare rows (up to
        `capacity_rows`, default twice the rows) and JOIN_HEADROOM_SLOTS spare slots, so that the following
        joins are written in place (a rebuild copies every running row's cache: at 64 rows of ~300 tokens,
        ~0.9 GB), without the slots before every running row's first, so the buffer stays as wide as its
        oldest row. Not with a shared prompt cache (`group_size` > 1)."""
        if self.shared:
            raise ValueError("add_rows needs the per-row cache layout (group_size 1)")
        new_kv, new_bias, new_start = self._prefix(model, input_ids, attention_mask)
        running, added, prefix_len = self.kv.shape[2], input_ids.shape[0], new_kv.shape[4]
        store = self._kv_store
        in_place = (
            prefix_len <= self.length
            and running + added <= store.shape[2]
            and self.length + max_new_tokens <= store.shape[4]
        )
        # A rebuild drops the slots before every running row's first: a batch that never drains (a busy
        # endpoint) would otherwise widen by one slot per step for as long as it runs.
        trim = 0 if in_place else int(self.start.min())
        kept = self.length - trim  # the running rows' slots that move to the new buffer
        end = self.length if in_place else max(kept, prefix_len)  # where every row's filled slots end
        if not in_place:
            slots = end + max(self.kv.shape[4] - self.length, max_new_tokens) + JOIN_HEADROOM_SLOTS
            rows = max(running + added, capacity_rows or 2 * (running + added))
            store = self.kv.new_empty(2, len(self.layers), rows, self.kv_heads, slots, self.head_dim)
            # padding is read (masked): it must hold finite values
            store[:, :, :running, :, : end - kept] = 0.0
            store[:, :, :running, :, end - kept : end] = self.kv[:, :, :, :, trim : self.length]
            bias = self.bias.new_full((running, 1, 1, slots), float("-inf"))
            bias[:, :, :, end - kept : end] = self.bias[:, :, :, trim : self.length]
            bias[:, :, :, end:] = 0.0
            self.bias, self._kv_store = bias, store
        joined = store[:, :, running : running + added]
        joined[:, :, :, :, : end - prefix_len] = 0.0
        joined[:, :, :, :, end - prefix_len : end] = new_kv
        bias = self.bias.new_full((added, 1, 1, store.shape[4]), float("-inf"))
        bias[:, :, :, end - prefix_len : end] = new_bias
        bias[:, :, :, end:] = 0.0  # the slots the coming steps fill
        self.start = torch.cat([self.start + end - self.length, new_start + end - prefix_len])
        self.kv, self.bias, self.length = store[:, :, : running + added], torch.cat([self.bias, bias]), end

    def _group_layout(self) -> None:
        """Where each row's queries go in the (prompts, widest group) grid the shared-prefix attention runs
        on; rows stay ordered by prompt, so a row's rank in its group is its index minus its group's first
        index."""
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
        # one fused op; in float32 it equals transformers' LlamaRMSNorm bit for bit
        # (tests/inference/test_sampler.py)
        return F.rms_norm(hidden, weight.shape, weight, self.eps).to(self.dtype)

    def _rope(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.float().unsqueeze(-1) * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return (
            (angles.cos() * self.rope_scale).to(dtype)[:, None, :],
            (angles.sin() * self.rope_scale).to(dtype)[:, None, :],
        )

    def _attend(
        self, index: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """q (B, H_kv, H/H_kv, D) against the row's own cache and, when shared, its prompt's."""
        own, own_lse = sdpa_with_lse(q, keys[index], values[index], bias, self.scale)
        if not self.shared:
            return own
        batch, kv_heads, fold, dim = q.shape
        prompts = self.prompt_kv.shape[2]
        grid = q.new_zeros(prompts * self.width, kv_heads, fold, dim)
        grid[self.slots] = q
        grid = grid.view(prompts, self.width, kv_heads, fold, dim).transpose(1, 2)
        out, lse = sdpa_with_lse(
            grid.reshape(prompts, kv_heads, self.width * fold, dim),
            self.prompt_kv[0, index],
            self.prompt_kv[1, index],
            self.prompt_bias,
            self.scale,
        )
        out = (
            out.view(prompts, kv_heads, self.width, fold, dim)
            .transpose(1, 2)
            .reshape(-1, kv_heads, fold, dim)
        )
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
            qk = qkv[:, : q_size + kv_size].view(batch, heads_qk, self.head_dim)
            if self.qk_norms[index] is not None:  # Qwen3: each head's q and k RMSNorm-ed before RoPE
                qk = (F.rms_norm(qk.float(), (self.head_dim,), eps=self.eps) * self.qk_norms[index]).to(
                    self.dtype
                )
            # queries and keys rotate together: one RoPE for both instead of one each
            qk = self._rotate(qk, cos, sin)
            self.kv[0, index, :, :, slot] = qk[:, self.heads :]
            self.kv[1, index, :, :, slot] = qkv[:, q_size + kv_size :].view(
                batch, self.kv_heads, self.head_dim
            )
            q = qk[:, : self.heads].view(batch, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
            attended = self._attend(index, q, keys, values, bias)
            hidden = hidden + o_proj(attended.reshape(batch, q_size))
            gate, up = gate_up_proj(self._norm(hidden, norm_post)).chunk(2, dim=-1)
            hidden = hidden + down_proj(F.silu(gate) * up)
        return self.lm_head(self._norm(hidden, self.final_norm)).float()

    def _fused_step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """`step` through the fused kernels: per layer four projections and four kernel calls."""
        rows = torch.arange(tokens.shape[0], device=tokens.device)
        x = self._fused_layers(
            tokens,
            positions,
            rows,
            torch.full_like(rows, self.length),
            self.kv,
            self.start,
            self.prompt_kv if self.shared else None,
        )
        self.length += 1
        # in the sampling dtype: the fused sampler reads bf16 as it is (a float32 copy would be one more pass
        # over the step's largest activation, every row's logits)
        return self.lm_head(x)

    def _fused_layers(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        rows: torch.Tensor,
        slots: torch.Tensor,
        cache: torch.Tensor,
        cache_start: torch.Tensor,
        prompt_kv: torch.Tensor | None,
    ) -> torch.Tensor:
        """Every layer for N tokens (each at its cache row and slot), in one call of the fused kernels' layer
        loop (`run_layers`: per layer four projections, `attend`, `add_rms_norm` twice, `silu_mul`). Writes
        their keys and values into `cache`; returns the final norm of the residual stream, (N, C) in the
        sampling dtype."""
        cos, sin = (part.squeeze(1).contiguous() for part in self._rope(positions, torch.float32))
        empty = cache.new_empty(0)
        shared = (
            (prompt_kv, self.prompt_start, self.row_prompt) if prompt_kv is not None else (empty, rows, rows)
        )
        return self.kernels.run_layers(
            F.embedding(tokens, self.embed).float(),
            self.layer_tensors,
            cos,
            sin,
            rows,
            slots,
            cache,
            cache_start,
            *shared,
            self.heads,
            self.scale,
            self.eps,
        )

    def _packed_prefill(self, prefix_ids: torch.Tensor, prefix_mask: torch.Tensor) -> torch.Tensor:
        """The prompts' keys and values, (2, layers, prompts, H_kv, width, D), left-padded (zeros in the
        padding), from one pass over their tokens packed without padding: the projections run on all real
        tokens at once, and each token attends to its own prompt only (the fused `attend`, one query per
        token, reading its row of the cache from the prompt's first slot). In chunks of whole prompts
        (PREFILL_CHUNK_TOKENS) to bound the activations' memory. With a `prefix_cache`, the beginning the
        prompts share is copied in first (`_shared_beginning`) and only the rest of each prompt runs; the
        first prompt is stored for later calls."""
        prompts, width = prefix_ids.shape
        kv = torch.zeros(
            2,
            len(self.layers),
            prompts,
            self.kv_heads,
            width,
            self.head_dim,
            dtype=self.kv_dtype,
            device=prefix_ids.device,
        )
        real = prefix_mask.bool()
        lengths = real.sum(-1)
        start = width - lengths
        common = self._shared_beginning(prefix_ids, real, start, kv) if self.prefix_cache is not None else 0
        row_of, slot_of = real.nonzero(as_tuple=True)  # row-major: each prompt's tokens together, in order
        positions = slot_of - start[row_of]
        rest = positions >= common
        row_of, slot_of, positions = row_of[rest], slot_of[rest], positions[rest]
        tokens = prefix_ids[row_of, slot_of]
        first = previous = 0
        for end in (lengths - common).cumsum(0).tolist() + [
            None
        ]:  # close a chunk before the prompt that overflows
            if previous > first and (end is None or end - first > PREFILL_CHUNK_TOKENS):
                part = slice(first, previous)
                self._fused_layers(
                    tokens[part], positions[part], row_of[part], slot_of[part], kv, start, None
                )
                first = previous
            previous = end
        if self.prefix_cache is not None:  # copies: a view would keep every prompt's cache alive
            own = slice(int(start[0]), width)
            self.prefix_cache.store(
                prefix_ids[0, own].clone(),
                [
                    (kv[0, layer, 0, :, own].clone(), kv[1, layer, 0, :, own].clone())
                    for layer in range(len(self.layers))
                ],
            )
        return kv

    def _shared_beginning(
        self, prefix_ids: torch.Tensor, real: torch.Tensor, start: torch.Tensor, kv: torch.Tensor
    ) -> int:
        """How many first tokens every prompt shares with a `prefix_cache` entry, else with each other (0
        below SHARED_PREFIX_MIN_TOKENS), their keys and values written into each prompt's first slots of `kv`:
        from the entry, or from one pass over the first prompt's beginning. A key depends on its token's
        position, not on its slot, and attention is causal, so these are the keys and values each prompt's own
        pass would give."""
        rows = [ids[mask] for ids, mask in zip(prefix_ids, real, strict=True)]
        common, stored = self.prefix_cache.beginning(rows)
        if common == 0:
            return 0
        if stored is None:
            slots = int(start[0]) + torch.arange(common, device=kv.device)
            self._fused_layers(
                rows[0][:common],
                torch.arange(common, device=kv.device),
                torch.zeros_like(slots),
                slots,
                kv,
                start,
                None,
            )
            beginning = kv[:, :, 0, :, int(start[0]) : int(start[0]) + common]
        else:
            beginning = torch.stack(
                [torch.stack([keys[:, :common], values[:, :common]]) for keys, values in stored], 1
            )
        for row, first in enumerate(start.tolist()):
            if row or stored is not None:
                kv[:, :, row, :, first : first + common] = beginning
        return common

    def select(self, keep: torch.Tensor) -> None:
        # Compacted in place, filled slots only: row keep[i] moves to row i, in ascending i (keep is sorted,
        # so keep[i] >= i and no row is overwritten before it has moved); index_select would copy the empty
        # tail too.
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


def make_stepper(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_new_tokens: int,
    dtype: torch.dtype | None = None,
    decoder: str = "auto",
    group_size: int = 1,
    prefix_cache: PrefixCache | None = None,
    weights: StepperWeights | None = None,
) -> Stepper:
    """A stepper that has run the prompts (left-padded, each once) up to their last token, which its first
    step takes: the lean stepper where it implements the model exactly ("auto"), else, or with "hf",
    transformers' own (which samples in the model's dtype: `dtype` needs the lean stepper). It decodes
    `group_size` rows per prompt (rows i*G .. i*G+G-1 for prompt i). `weights`: the lean stepper's snapshot of
    the model's weights, made once by a caller that samples many times from the same weights
    (`StepperWeights`); None makes one for this call."""
    if decoder not in ("auto", "hf"):
        raise ValueError(f"decoder {decoder!r}: expected 'auto' or 'hf'")
    if decoder == "auto" and lean_supported(model):
        return LeanStepper(
            model, input_ids, attention_mask, max_new_tokens, dtype, group_size, prefix_cache, weights
        )
    cache = prefill(model, input_ids[:, :-1], attention_mask[:, :-1], dtype or model.dtype)
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    return HFStepper(model, cache, attention_mask.repeat_interleave(group_size, 0))
