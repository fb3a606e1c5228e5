"""Attention over two disjoint key sets, merged from each set's output and log-sum-exp: how the lean stepper
on torch's ops (`decoding.LeanStepper`) attends when the G samples of a prompt share its keys and values, the
group's queries against the prompt together and each row against its own tokens (the fused kernels' `attend`
reads both in one softmax instead)."""

from __future__ import annotations

import torch


def merge_attention(
    out_a: torch.Tensor, lse_a: torch.Tensor, out_b: torch.Tensor, lse_b: torch.Tensor
) -> torch.Tensor:
    """Softmax attention over the union of two disjoint key sets, from each set's output and log-sum-exp of
    its scores (the split-KV merge of FlashDecoding, Dao et al. 2023; Juravsky et al., Hydragen, arXiv
    2402.05099):
        lse = log(e^lse_a + e^lse_b),   out = e^(lse_a - lse) out_a + e^(lse_b - lse) out_b.
    out_*: (..., D); lse_*: (...) in float32."""
    lse = torch.logaddexp(lse_a, lse_b)
    merged = out_a * (lse_a - lse).exp().unsqueeze(-1) + out_b * (lse_b - lse).exp().unsqueeze(-1)
    return merged.to(out_a.dtype)


# Attention that also returns the log-sum-exp of the scores, which `merge_attention` needs. The public
# scaled_dot_product_attention returns the output only; this is the same CPU kernel it dispatches to.
_attention_with_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def attention_with_lse_by_ops(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias) v and the log-sum-exp of those scores, in float32 by torch's ops, on any
    device (`sdpa_with_lse` off a CPU). A row whose keys are all masked gets zeros and a log-sum-exp of -inf,
    so `merge_attention` gives it no weight."""
    scores = torch.matmul(q.float(), keys.float().transpose(-1, -2)) * scale + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    weights = torch.exp(scores - lse.unsqueeze(-1)).nan_to_num(nan=0.0)  # -inf - -inf: a fully masked row
    return torch.matmul(weights, values.float()).to(q.dtype), lse


def sdpa_with_lse(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp) of scaled-dot-product attention: PyTorch's CPU flash-attention kernel on a CPU
    (what F.scaled_dot_product_attention runs there), `attention_with_lse_by_ops` elsewhere (that kernel is
    CPU-only)."""
    if q.device.type == "cpu":
        return _attention_with_lse(q, keys, values, attn_mask=bias, scale=scale)[:2]
    return attention_with_lse_by_ops(q, keys, values, bias, scale)
