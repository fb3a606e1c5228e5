"""Attention over two disjoint key sets, merged from each set's output and log-sum-exp: how the lean stepper on
torch's ops (`decoding.LeanStepper`) attends when the G samples of a prompt share its keys and values, the group's
queries against the prompt together and each row against its own tokens (the fused kernels' `attend` reads both in
one softmax instead)."""

from __future__ import annotations

import torch


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

