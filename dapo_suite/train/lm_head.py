"""The LM head's log-probs and entropy, in chunks of tokens, without full-vocabulary logits kept for backward.

log pi(y_t | context) = z_t[y_t] - logsumexp(z_t), z_t = W h_t / T, over a 49k vocabulary, is the update's
widest tensor: (tokens, V) logits in float32, their softmax and their gradient are each ~200 KB a token. The
reference path (`algorithm.token_log_probs` on the model's logits) keeps several such tensors alive for
backward; here the head runs on the packed tokens that carry loss only (no padding, no tool tokens), a chunk
at a time, saves only each token's logsumexp, and recomputes the chunk's logits in backward:

    d log pi_t / d z_t = onehot(y_t) - softmax(z_t)        (so the gradient needs softmax, not the log-probs)

the standard fused cross-entropy trick (Liger-Kernel's fused linear cross entropy, arXiv 2410.10989), here for
the log-probs a policy-gradient loss reads. Entropy, H_t = logsumexp(z_t) - sum softmax(z_t) z_t, is a metric
(no gradient), computed from the same chunk.
"""

from __future__ import annotations

import torch

CHUNK_TOKENS = 512  # logits of one chunk: 512 x 49152 float32 = 100 MB, the working set of one pass


class _ChunkedLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature: float, dtype: torch.dtype, chunk: int):
        matmul_weight = weight.detach().to(dtype)
        log_probs = hidden.new_empty(hidden.shape[0], dtype=torch.float32)
        entropy = torch.empty_like(log_probs)
        log_z = torch.empty_like(log_probs)
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = _logits(hidden[rows].detach(), matmul_weight, temperature)
            log_z[rows] = torch.logsumexp(logits, dim=-1)
            log_probs[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - log_z[rows]
            logits.sub_(log_z[rows, None])  # now log softmax
            entropy[rows] = -(logits.exp() * logits).sum(-1)
        ctx.save_for_backward(hidden, weight, targets, log_z)
        ctx.temperature, ctx.dtype, ctx.chunk = temperature, dtype, chunk
        ctx.mark_non_differentiable(entropy)
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs, _grad_entropy):
        hidden, weight, targets, log_z = ctx.saved_tensors
        matmul_weight = weight.detach().to(ctx.dtype)
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            chunk_hidden = hidden[rows].detach().to(ctx.dtype)
            logits = _logits(chunk_hidden, matmul_weight, ctx.temperature)
            grad = logits.sub_(log_z[rows, None]).exp_()  # softmax, in place
            upstream = grad_log_probs[rows].float()
            grad.mul_(-upstream[:, None])
            grad.scatter_add_(-1, targets[rows, None], upstream[:, None])
            grad = grad.div_(ctx.temperature).to(ctx.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = grad @ matmul_weight
            if grad_weight is not None:
                grad_weight.add_(grad.T @ chunk_hidden)
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None


def _logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """z = W h / T for one chunk, (rows, V) in float32 (the matmul in `weight`'s dtype)."""
    logits = (hidden.to(weight.dtype) @ weight.T).float()
    return logits.div_(temperature) if temperature != 1.0 else logits


def head_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    dtype: torch.dtype = torch.float32,
    chunk: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log pi(target), entropy) per token, (N,) each in float32, from final hidden states (N, H), the LM
    head's weight (V, H) and the targets (N,): the values of `token_log_probs` and `entropy_from_logits` on
    `hidden @ weight.T / temperature`, the head's matmuls in `dtype` (bf16 under the trainer's autocast)."""
    return _ChunkedLogProbs.apply(hidden, weight, targets, temperature, dtype, chunk)
