"""One decode step at a time for `sampling.sample_tokens`: a static KV cache and a lean forward pass.

On a CPU, decoding the embedded model one token at a time is bound by memory traffic and Python overhead, not
arithmetic. transformers' own step (`HFStepper`) grows its KV cache with `torch.cat` on every step, so each step
copies the whole cache once per layer (at 64 rows x 300 tokens that is ~0.9 GB per step, more than the weights),
and runs ~70 module calls per layer. `LeanStepper` preallocates the cache once (keys and values of every layer
in one tensor, so dropping finished rows is one `index_select`), fuses the q/k/v and gate/up projections into
one matmul each, and runs the Llama block as a handful of tensor operations. It is used for the architectures in
`LEAN_ARCHITECTURES`; any other model decodes through `HFStepper`. In bfloat16 on a CPU, the lean stepper's
weights are reordered once into oneDNN's blocked layout (`Projection`) and its decode attention is compiled
(`fused_attention`). Both steppers take the KV cache that transformers' prefill produced, so the prompt is always
processed by the model's own code.

Measured in `benchmarks/sampler_bound.py`; tokens and log-probs equal transformers' in float32 (tests/test_sampler.py).
"""

from __future__ import annotations

import functools
import warnings
from typing import Protocol

import torch
import torch.nn.functional as F

# model_type -> whether its attention projections carry biases (Qwen2: q, k and v do). Both are the plain
# pre-norm Llama block with default RoPE; models with other RoPE scalings fall back to HFStepper.
LEAN_ARCHITECTURES = {"llama": False, "qwen2": True}


class Stepper(Protocol):
    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, (B,) at positions (B,); return the next-token logits (B, V) in float32."""

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


def packs_bf16(dtype: torch.dtype, device: torch.device) -> bool:
    """Whether `Projection` reorders weights for oneDNN: bfloat16 weights on a CPU whose oneDNN runs bf16."""
    return (dtype == torch.bfloat16 and device.type == "cpu" and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Projection:
    """x W^T + b for a weight that stays fixed while the stepper lives.

    In bfloat16 on a CPU the weight is reordered once into oneDNN's blocked layout and applied by oneDNN's linear
    kernel: at the decoder's shapes (576-3072 outputs, 1-128 rows) that is 1.3-3x aten's bf16 `F.linear`, which
    reads the weights at 13-26 GB/s where a copy runs at ~40, and gives the same values bit for bit
    (tests/test_sampler.py; benchmarks/sampler_bound.py). Any other dtype or device uses `F.linear`."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None) -> None:
        self.packed = packs_bf16(weight.dtype, weight.device)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1) if self.packed else weight
        self.bias = bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
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


def attention_with_lse(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                       scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Scaled dot-product attention (Vaswani et al. 2017, arXiv 1706.03762) and the log-sum-exp of its scores:
        S = scale * q K^T + bias,   lse = log sum_t e^S_t,   out = e^(S - lse) V,
    in float32 arithmetic. q (B, H, Q, D); keys, values (B, H, T, D); bias (B, 1, 1, T) -> out (B, H, Q, D) in
    q's dtype, lse (B, H, Q) in float32.

    Written as broadcast products and sums, not matmuls, so that torch.compile (`fused_attention`) turns it into
    one loop over each row's cache. CPU SDPA instead runs two tiny GEMMs per (row, head), with a few query rows
    each, and reads a bf16 cache at 10-14 GB/s."""
    scores = (q.float().unsqueeze(-2) * keys.float().unsqueeze(-3)).sum(-1) * scale + bias.float()
    lse = scores.logsumexp(-1)
    weights = (scores - lse.unsqueeze(-1)).exp()
    return (weights.unsqueeze(-1) * values.float().unsqueeze(-3)).sum(-2).to(q.dtype), lse


@functools.cache
def fused_attention():
    """`attention_with_lse` compiled by inductor for any batch and cache length (compiled on first call, ~10 s)."""
    return torch.compile(attention_with_lse, dynamic=True)


# Where the compiled attention beats SDPA (bf16, 2 threads, fused vs SDPA): from 4 rows (at 450 positions: 56 vs
# 39 us at 1 row, 96 vs 97 at 4, 262 vs 349 at 15; 0.63 vs 1.05 ms at 64 rows x 300), and for few query rows per
# key/value head (a decode step's grouped heads: 3 here, 7 for Qwen2.5-0.5B: 1.20 vs 1.52 ms at 64 rows); SDPA's
# GEMMs win on many (12 queries: 283 vs 249 us at 8 rows; the shared prompt's G x 3: 398 vs 316).
FUSED_ATTENTION_MIN_ROWS = 4
FUSED_ATTENTION_MAX_QUERIES = 8


class LeanStepper:
    """Decode steps for a Llama-style model with a preallocated cache.

    Per layer (pre-norm; RMSNorm(x) = w * x / sqrt(mean(x^2) + eps)):
        q, k, v = split(RMSNorm(h) W_qkv^T);  q, k = RoPE(q, pos), RoPE(k, pos)
        h = h + Attn(q, K[:t], V[:t]) W_o^T;  g, u = split(RMSNorm(h) W_gu^T);  h = h + (silu(g) * u) W_down^T
    Grouped-query attention reads K and V once per key/value head: the H/H_kv query heads of a group are folded
    into the query axis, (B, H, D) -> (B, H_kv, H/H_kv, D), exactly as `models.grouped_query_sdpa` does.

    With `group_size` G > 1 (the G samples of a prompt, rows i*G .. i*G+G-1), the prompt's keys and values are
    stored once and read once per step for the whole group: the group's queries attend to the prompt together
    (one attention with G times the query rows), each row attends to its own tokens, and the two parts are
    merged by `merge_attention`. On a CPU, decode attention is bound by reading the cache, so with a 200-token
    prompt and G = 8 this reads the prompt 8x less. With G = 1 the prompt sits in each row's own cache.
    """

    def __init__(self, model, cache, attention_mask: torch.Tensor, max_new_tokens: int,
                 dtype: torch.dtype | None = None, group_size: int = 1) -> None:
        config, inner = model.config, model.model
        dtype = dtype or model.dtype
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = config.rms_norm_eps
        rotary = inner.rotary_emb
        self.inv_freq, self.rope_scale = rotary.inv_freq.float(), rotary.attention_scaling
        # The weights are a snapshot (fused, in the sampling dtype): a stepper lives for one sample_tokens call,
        # between two updates of the policy.
        # The residual stream and the RMSNorms stay in float32 whatever the sampling dtype; only the projections'
        # inputs are cast down. That is what the trainer's autocast computes (so the sampler's log-probs stay close
        # to its recomputation), and RMSNorm in float32 is cheaper than in bf16 (which upcasts and casts back).
        self.dtype = dtype
        # bf16 decode attention through `fused_attention`; float32 keeps SDPA, the kernel transformers runs, so that
        # float32 samples equal transformers' (tests/test_sampler.py)
        self.compiled_attention = dtype == torch.bfloat16 and attention_mask.device.type == "cpu"
        self.embed, self.final_norm = inner.embed_tokens.weight.to(dtype), inner.norm.weight.float()
        tied = model.lm_head.weight is inner.embed_tokens.weight
        self.lm_head = Projection(self.embed if tied else model.lm_head.weight.to(dtype))
        self.layers = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_bias = None
            if LEAN_ARCHITECTURES[config.model_type]:
                qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).to(dtype)
            self.layers.append((
                layer.input_layernorm.weight.float(),
                Projection(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).to(dtype), qkv_bias),
                Projection(attn.o_proj.weight.to(dtype)), layer.post_attention_layernorm.weight.float(),
                Projection(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).to(dtype)),
                Projection(mlp.down_proj.weight.to(dtype)),
            ))
        self.scale = self.head_dim ** -0.5
        # `cache` holds each prompt once (P slots, left-padded); `attention_mask` is (prompts, P + 1).
        prompt_len, prompts = cache.layers[0].keys.shape[-2], attention_mask.shape[0]
        prompt_kv = torch.stack([torch.stack([layer.keys, layer.values]) for layer in cache.layers], dim=1).to(dtype)
        prompt_bias = torch.zeros(prompts, 1, 1, prompt_len, dtype=dtype, device=attention_mask.device)
        prompt_bias.masked_fill_(~attention_mask[:, None, None, :prompt_len].bool(), float("-inf"))
        # A prompt of one token has no cached prefix, and the kernel gives a fully masked prefix weight e^0: share
        # only when every prompt has one.
        self.shared = group_size > 1 and bool(attention_mask[:, :prompt_len].any(-1).all())
        own_len = max_new_tokens if self.shared else prompt_len + max_new_tokens
        # Each row's own keys and values of every layer in one buffer: (2, layers, rows, H_kv, slots, D), so
        # dropping finished rows is one index_select.
        self.kv = torch.empty(2, len(self.layers), prompts * group_size, self.kv_heads, own_len, self.head_dim,
                              dtype=dtype, device=attention_mask.device)
        self.bias = torch.zeros(prompts * group_size, 1, 1, own_len, dtype=dtype, device=attention_mask.device)
        if self.shared:
            self.prompt_kv, self.prompt_bias = prompt_kv, prompt_bias
            self.row_prompt = torch.arange(prompts, device=attention_mask.device).repeat_interleave(group_size)
            self._group_layout()
            self.length = 0  # own slots filled so far
        else:
            self.kv[:, :, :, :, :prompt_len] = prompt_kv.repeat_interleave(group_size, dim=2)
            self.bias[:, :, :, :prompt_len] = prompt_bias.repeat_interleave(group_size, dim=0)
            self.length = prompt_len

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

    def _attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                   bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        worth_it = q.shape[0] >= FUSED_ATTENTION_MIN_ROWS and q.shape[2] <= FUSED_ATTENTION_MAX_QUERIES
        if not (self.compiled_attention and worth_it):
            return sdpa_with_lse(q, keys, values, bias, self.scale)
        try:
            return fused_attention()(q, keys, values, bias, self.scale)
        except torch._dynamo.exc.BackendCompilerFailed as error:  # e.g. no C++ compiler: SDPA computes the same
            cause = error.inner_exception
            warnings.warn(f"compiled decode attention unavailable ({type(cause).__name__}: {str(cause).splitlines()[0]}"
                          "); decoding with SDPA, ~1.6x slower attention at 64 rows. A C++ compiler (g++ or clang, "
                          "what torch.compile's inductor needs) enables it.", stacklevel=2)
            self.compiled_attention = False
            return sdpa_with_lse(q, keys, values, bias, self.scale)

    def _attend(self, index: int, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                bias: torch.Tensor) -> torch.Tensor:
        """q (B, H_kv, H/H_kv, D) against the row's own cache and, when shared, its prompt's."""
        own, own_lse = self._attention(q, keys[index], values[index], bias)
        if not self.shared:
            return own
        batch, kv_heads, fold, dim = q.shape
        prompts = self.prompt_kv.shape[2]
        grid = q.new_zeros(prompts * self.width, kv_heads, fold, dim)
        grid[self.slots] = q
        grid = grid.view(prompts, self.width, kv_heads, fold, dim).transpose(1, 2)
        out, lse = self._attention(grid.reshape(prompts, kv_heads, self.width * fold, dim),
                                   self.prompt_kv[0, index], self.prompt_kv[1, index], self.prompt_bias)
        out = out.view(prompts, kv_heads, self.width, fold, dim).transpose(1, 2).reshape(-1, kv_heads, fold, dim)
        lse = lse.view(prompts, kv_heads, self.width, fold).transpose(1, 2).reshape(-1, kv_heads, fold)
        return merge_attention(own, own_lse, out[self.slots], lse[self.slots])

    def step(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
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

    def select(self, keep: torch.Tensor) -> None:
        self.kv, self.bias = self.kv.index_select(2, keep), self.bias[keep]
        if not self.shared:
            return
        self.row_prompt = self.row_prompt[keep]
        alive = torch.unique(self.row_prompt)  # sorted
        if alive.numel() < self.prompt_kv.shape[2]:  # whole groups finished: stop reading their prompts
            self.prompt_kv, self.prompt_bias = self.prompt_kv.index_select(2, alive), self.prompt_bias[alive]
            self.row_prompt = torch.searchsorted(alive, self.row_prompt)
        self._group_layout()


def make_stepper(model, cache, attention_mask: torch.Tensor, max_new_tokens: int,
                 dtype: torch.dtype | None = None, decoder: str = "auto", group_size: int = 1) -> Stepper:
    """The lean stepper where it implements the model exactly ("auto"), else, or with "hf", transformers' own
    (which samples in the model's dtype: `dtype` needs the lean stepper). `cache` and `attention_mask` hold
    each prompt once; the stepper decodes `group_size` rows per prompt (rows i*G .. i*G+G-1 for prompt i)."""
    if decoder not in ("auto", "hf"):
        raise ValueError(f"decoder {decoder!r}: expected 'auto' or 'hf'")
    if decoder == "auto" and lean_supported(model):
        return LeanStepper(model, cache, attention_mask, max_new_tokens, dtype, group_size)
    if group_size > 1:
        cache.batch_repeat_interleave(group_size)
    return HFStepper(model, cache, attention_mask.repeat_interleave(group_size, 0))
