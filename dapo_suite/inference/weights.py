"""The lean stepper's weights (`StepperWeights`): a snapshot of the model's, cast, fused and packed once, and
`Projection`, one weight packed for the fused kernels' own matmul (`fused_step`)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch
import torch.nn.functional as F

from dapo_suite.inference.fused_step import kernels
from dapo_suite.inference.models import merged_weight

# The model types whose block the lean stepper implements: the pre-norm Llama block, with q/k/v biases where
# the model has them (Qwen2) and Qwen3's per-head RMSNorm of q and k before RoPE (`qk_norm`); their RoPE
# frequencies are the model's own rotary module's (any static rope_type: `decoding.lean_refusal` says which
# fall back).
LEAN_ARCHITECTURES = ("llama", "qwen2", "qwen3")

# The head sizes `attend` is compiled for (csrc/attention.cpp); other models decode with torch's ops.
FUSED_HEAD_DIMS = (64, 128)


class Projection:
    """x W^T + b for a weight that stays fixed while the stepper lives.

    Given the fused kernels (`fused_step.kernels()`), the weight is packed once for their `linear` and only
    the packed copy is kept. In bf16 (a CPU with avx512_bf16: blocks of 48 outputs in pair order), at the row
    counts the decoder runs, it is faster than oneDNN's and aten's linear at 1-64 rows (a decode step) and on
    par at 2048 (a prompt pass's chunk) on a CPU without AMX (benchmarks/projections.py, docs/benchmarks.md);
    with AMX, `linear` runs 8-64 rows on the tile unit over the same packed weight (`TILE_MIN_ROWS`), and from
    65 rows (a prompt pass) oneDNN's tile matmul, so there the weight is also kept in oneDNN's blocked layout
    (`ONEDNN_MIN_ROWS`). In float32, blocks of the CPU's vector width times its tile. A weight it cannot pack
    (bf16: outputs % 16, inputs % 2; float32: outputs % the vector width), and any other dtype or device, uses
    `F.linear`."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None = None,
        kernels: ModuleType | None = None,
        quantization: str | None = None,
    ) -> None:
        self.scales = None  # an int8 weight's, where torch's op multiplies it
        packed = weight.new_empty(0)
        if quantization is not None:  # the sampler's copy quantized; float32 activations
            weight_format = QUANTIZERS[quantization]
            q, scales = weight_format.quantize(weight)
            bias = None if bias is None else bias.float()
            if kernels is not None:
                packed = getattr(kernels, weight_format.pack)(q, scales)
            if not packed.numel():  # no kernel for it here: torch's ops
                weight, self.scales = weight_format.unpacked(q, scales)
        elif kernels is not None:
            packed = kernels.pack_weight(weight)
        self.kernels = kernels if packed.numel() else None
        self.weight = packed if packed.numel() else weight
        # on an AMX CPU the bf16 weight is also kept in oneDNN's layout: from ONEDNN_MIN_ROWS rows `linear`
        # runs oneDNN on it (reordered once here: on the weight as given, oneDNN would reorder it on every
        # call). The layout is picked for 64 rows; it gives the same bits at any row count.
        keep_onednn = (
            self.kernels is not None and weight.dtype == torch.bfloat16 and kernels.ONEDNN_MIN_ROWS > 0
        )
        self.onednn = (
            torch.ops.mkldnn._reorder_linear_weight(weight, 64) if keep_onednn else weight.new_empty(0)
        )
        # `linear` takes "no bias" as an empty tensor, made once rather than allocated on every call
        self.bias = weight.new_empty(0) if bias is None and self.kernels is not None else bias

    @property
    def packed(self) -> bool:
        """Whether the fused `linear` applies it (the fused layer loop needs every layer's weights packed)."""
        return self.kernels is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None:
            return self.kernels.linear(x.contiguous(), self.weight, self.bias, self.onednn)
        if self.scales is not None:  # no fused kernels here, or a width they cannot pack
            y = torch._weight_int8pack_mm(x.reshape(-1, x.shape[-1]).float(), self.weight, self.scales)
            y = y.view(*x.shape[:-1], -1)
            return y if self.bias is None else y + self.bias
        return F.linear(x, self.weight, self.bias)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight-only int8 per output channel, symmetric, as FlashRL's int8 rollouts (2025) and vLLM's W8A16:
    W ~ q s with q = round(W / s) in [-127, 127], s_o = max_i |W_oi| / 127. Returns (q (O, I) int8, s (O,)
    float32)."""
    weight = weight.float()
    scales = weight.abs().amax(1).clamp_min(1e-30) / 127
    return (weight / scales[:, None]).round().clamp(-127, 127).to(torch.int8), scales


INT4_GROUP = 32  # inputs per int4 scale: llama.cpp's Q4_0 block


def quantize_int4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight-only int4 in groups of 32 inputs per output, as llama.cpp's Q4_0: per group the weight of
    largest magnitude m sets s = m / -8 (rounded to float16, as stored), q = round(W / s) clamped to [-8, 7],
    so that weight is exactly -8 s and the others within s / 2 (within s where the clamp cuts a weight of the
    other sign near 8 s); GPTQ and AWQ use the same group size. A last group narrower than 32 is quantized as
    if zero-padded. Returns (q (O, I) int8 in [-8, 7], s (O, ceil(I / 32)) float32 holding float16 values)."""
    out, width = weight.shape
    groups = _in_groups(weight.float())
    largest = groups.gather(2, groups.abs().argmax(2, keepdim=True)).squeeze(2)
    scales = (largest / -8).half().float()
    safe = torch.where(scales == 0, torch.ones_like(scales), scales)
    q = (groups / safe[..., None]).round().clamp(-8, 7).to(torch.int8)
    return q.reshape(out, -1)[:, :width].contiguous(), scales


def _in_groups(weight: torch.Tensor) -> torch.Tensor:
    """(O, I) -> (O, ceil(I / 32), 32), the last group zero-padded."""
    out, width = weight.shape
    padded = F.pad(weight, (0, -width % INT4_GROUP))
    return padded.reshape(out, -1, INT4_GROUP)


@dataclass(frozen=True)
class WeightFormat:
    """A quantized format of the sampler's weights: how a weight is quantized, which of the fused kernels'
    packers lays it out for `linear`, and what torch's ops run where that packer cannot (`unpacked`: the
    weight they multiply and the int8 scales of `torch._weight_int8pack_mm`, or None for `F.linear`)."""

    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
    pack: str
    unpacked: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]
    bytes_per_weight: float  # what decoding reads per weight, its scales included (the bandwidth bound's)


def _int4_dequantized(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, None]:
    """q s in float32, for `F.linear` where the kernels cannot take the int4 weight."""
    out, width = q.shape
    return (_in_groups(q.float()) * scales[..., None]).reshape(out, -1)[:, :width].contiguous(), None


# rollout_quantization -> how the sampler's copy of each projection is quantized (TrainConfig checks the name)
QUANTIZERS = {
    "int8": WeightFormat(quantize_int8, "pack_weight_int8", lambda q, s: (q, s), 1.0),
    "int4": WeightFormat(quantize_int4, "pack_weight_int4", _int4_dequantized, 0.5 + 2 / INT4_GROUP),
}
QUANTIZED_ACTIVATIONS = torch.float32  # what quantized projections multiply (and the KV cache's default)
# rollout_kv_cache_dtype -> the KV cache's dtype given the activations' (as vLLM's --kv-cache-dtype: "auto"
# keeps the activations'); bf16 under float32 activations halves the bytes a decode step's attention reads
KV_CACHE_DTYPES = {"auto": lambda activations: activations, "bfloat16": lambda activations: torch.bfloat16}


@functools.cache  # once a process: a trainer makes a snapshot at every weight sync
def _warn_unfused(quantization: str) -> None:
    needs = " (int4's kernel needs AVX2 or AVX-512 VNNI)" if quantization == "int4" else ""
    warnings.warn(
        f"rollout_quantization {quantization}: no fused kernel takes these weights on this CPU{needs}; "
        "torch's ops decode them, slower than the float32 sampler",
        stacklevel=3,
    )


class StepperWeights:
    """The lean stepper's weights: a snapshot of the model's, in the sampling dtype, q/k/v and gate/up fused,
    each projection packed for the fused kernels' `linear` where they apply (`Projection`).

    Building one reads and rewrites every weight, a sizeable share of a short `sample_tokens` call
    (docs/benchmarks.md). A caller whose weights stay fixed across calls builds it once and passes it
    on (`HFEngine` until its `sync_weights`, the endpoint's `BatchDecoder` for its life); a change to the
    model's weights after that is not seen until a new snapshot is made. Every tensor in it is a copy
    (`.to(dtype)` of a tensor already in that dtype would be the model's own), so an update in place leaves a
    snapshot whole.

    `kv_cache_dtype` (KV_CACHE_DTYPES) names the dtype of the KV cache the steppers on this snapshot keep:
    bf16 under float32 activations needs the fused kernels (their `attend` reads it as float32; elsewhere the
    cache keeps the activations' dtype, with a warning)."""

    def __init__(
        self,
        model,
        dtype: torch.dtype | None = None,
        quantization: str | None = None,
        kv_cache_dtype: str = "auto",
    ) -> None:
        config, inner = model.config, model.model
        dtype = self.dtype = QUANTIZED_ACTIVATIONS if quantization else dtype or model.dtype
        self.quantization = quantization
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # On a CPU: the fused kernels (`fused_step`) in float32 everywhere and in bf16 where the CPU has bf16
        # dot products; elsewhere SDPA and aten's ops, what transformers runs
        fused = (
            kernels()
            if dtype in (torch.float32, torch.bfloat16)
            and inner.embed_tokens.weight.device.type == "cpu"
            and head_dim in FUSED_HEAD_DIMS
            else None
        )
        self.kernels = fused if fused is not None and (dtype == torch.float32 or fused.NATIVE_BF16) else None
        own = functools.partial(torch.Tensor.to, copy=True)  # a copy even where the dtype is the model's
        # LoRA layers (PEFT) are read with their adapters merged: the snapshot samples at the plain model's
        # speed
        weight = merged_weight
        self.embed, self.final_norm = (
            own(weight(inner.embed_tokens), dtype),
            own(inner.norm.weight, torch.float32),
        )
        tied = model.lm_head.weight is inner.embed_tokens.weight
        self.lm_head = Projection(
            self.embed if tied else own(weight(model.lm_head), dtype),
            kernels=self.kernels,
            quantization=quantization,
        )
        self.layers = []
        # per layer, Qwen3's q/k RMSNorm weights, one row per head the projection gives (H query heads, then
        # H_kv key heads: (H + H_kv, D) float32), or None where the block has none
        self.qk_norms: list[torch.Tensor | None] = []
        for layer in inner.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv_bias = None
            if attn.q_proj.bias is not None:  # Qwen2's q, k and v biases (o_proj has none: `lean_refusal`)
                qkv_bias = torch.cat([attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]).to(dtype)
            q_norm, k_norm = getattr(attn, "q_norm", None), getattr(attn, "k_norm", None)
            self.qk_norms.append(
                None
                if q_norm is None
                else torch.cat(
                    [
                        q_norm.weight.float().expand(config.num_attention_heads, -1),
                        k_norm.weight.float().expand(config.num_key_value_heads, -1),
                    ]
                ).contiguous()
            )
            self.layers.append(
                (
                    own(layer.input_layernorm.weight, torch.float32),
                    Projection(
                        torch.cat([weight(attn.q_proj), weight(attn.k_proj), weight(attn.v_proj)]).to(dtype),
                        qkv_bias,
                        self.kernels,
                        quantization,
                    ),
                    Projection(own(weight(attn.o_proj), dtype), None, self.kernels, quantization),
                    own(layer.post_attention_layernorm.weight, torch.float32),
                    Projection(
                        torch.cat([weight(mlp.gate_proj), weight(mlp.up_proj)]).to(dtype),
                        None,
                        self.kernels,
                        quantization,
                    ),
                    Projection(own(weight(mlp.down_proj), dtype), None, self.kernels, quantization),
                )
            )
        if not all(p.packed for _, qkv, o, _, gate_up, down in self.layers for p in (qkv, o, gate_up, down)):
            self.kernels = None  # a width `linear` cannot pack: the layers run on torch's ops
        if quantization and (self.kernels is None or not self.lm_head.packed):
            _warn_unfused(quantization)
        self.kv_dtype = KV_CACHE_DTYPES[kv_cache_dtype](dtype)
        if self.kv_dtype != dtype and self.kernels is None:
            warnings.warn(
                f"kv_cache_dtype {kv_cache_dtype}: only the fused kernels keep a cache in another dtype than "
                f"the activations' ({dtype}); the cache stays in {dtype}",
                stacklevel=2,
            )
            self.kv_dtype = dtype
        self.layer_tensors: list[list[torch.Tensor]] = []
        if self.kernels is not None:
            # the fused layer loop's weights: each layer's, the norm its MLP half ends with (the next layer's
            # input norm, or the final one), and its q/k norm (or empty)
            norms_after = [layer[0] for layer in self.layers[1:]] + [self.final_norm]
            self.layer_tensors = [
                [
                    norm_in,
                    qkv.weight,
                    qkv.bias,
                    o.weight,
                    norm_post,
                    gate_up.weight,
                    down.weight,
                    norm_after,
                    qkv.onednn,
                    o.onednn,
                    gate_up.onednn,
                    down.onednn,
                    qk_norm if qk_norm is not None else self.final_norm.new_empty(0),
                ]
                for (norm_in, qkv, o, norm_post, gate_up, down), norm_after, qk_norm in zip(
                    self.layers, norms_after, self.qk_norms, strict=True
                )
            ]
