"""The DAPO objective as pure tensor functions: no configs, no I/O, no engines.

Every trainer of this project (the embedded one and the verl extension) computes its loss, advantages,
penalties and filters here. Shapes: B responses, T response tokens (right-padded, `response_mask` 1 on real
tokens), V vocabulary. Equations are numbered as in the DAPO paper (arXiv 2503.14476).

Conventions the paper leaves open, chosen to match verl 0.9.1 (tests/test_algorithm.py checks each):
- the log-ratio is clamped to [-20, 20] before `exp` (numerical safety; never active in a healthy run);
- the group standard deviation is the unbiased (N-1) one; a group of one response gets mean 0 and std 1;
- under gradient accumulation the token-mean divides by the token count of the whole mini-batch, passed as
  `num_global_tokens`, so the sum of micro-batch losses equals the loss of the full mini-batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

LOSS_AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")
LOG_RATIO_LIMIT = 20.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (0 when the mask is empty)."""
    return (values * mask).sum() / mask.sum().clamp(min=1)


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    clip_c: float | None = None,
    agg: str = "token-mean",
    num_global_tokens: float | None = None,
    num_global_sequences: float | None = None,
    seq_sum_norm: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DAPO's clipped surrogate with decoupled clip (eq. 8, negated into a loss to minimise).

        r_it = pi_theta(o_it | q, o_i<t) / pi_old(o_it | q, o_i<t)
        L_it = -min( r_it * A_it , clip(r_it, 1 - eps_low, 1 + eps_high) * A_it )
        loss = sum_i sum_t L_it / sum_i |o_i|                               (token-mean, eq. 8)

    Clip-Higher (sec. 3.1) is `clip_high > clip_low` (paper: eps_low 0.2, eps_high 0.28). With `clip_c` set,
    dual-clip PPO bounds the loss of negative-advantage tokens at `-clip_c * A` (the 32B recipe uses 10).
    `agg` chooses the reduction: `token-mean` (DAPO, sec. 3.3), `seq-mean-token-mean` (GRPO's sample-level
    mean), `seq-mean-token-sum`, `seq-mean-token-sum-norm` (Dr. GRPO: sum over tokens / `seq_sum_norm`,
    default T). `num_global_tokens` / `num_global_sequences` replace this batch's own counts as denominators
    when it is one micro-batch of a larger mini-batch.

    Shapes: `log_prob`, `old_log_prob`, `response_mask` (B, T); `advantages` (B, T) or (B,).
    Returns the scalar loss and metrics: clip fractions (`actor/pg_clipfrac` any side, as verl counts it;
    `actor/clipfrac_upper`: r > 1 + eps_high with A > 0; `actor/clipfrac_lower`: r < 1 - eps_low with A < 0;
    `actor/dual_clipfrac`), `actor/ppo_kl` (mean of log pi_old - log pi_theta, verl's approx KL) and ratio
    statistics over response tokens.
    """
    if agg not in LOSS_AGGREGATIONS:
        raise ValueError(f"agg must be one of {LOSS_AGGREGATIONS}, got {agg!r}")
    mask = response_mask.to(log_prob.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)

    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if clip_c is not None:
        if clip_c <= 1.0:
            raise ValueError(f"clip_c (dual-clip bound) must be > 1, got {clip_c}")
        dual_bound = -advantages * clip_c
        dual_clipped = (token_loss > dual_bound) & (advantages < 0)
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, dual_bound), token_loss)

    loss = aggregate_loss(token_loss, mask, agg, num_global_tokens, num_global_sequences, seq_sum_norm)

    with torch.no_grad():
        real = mask.bool()
        ratio_real = ratio[real] if real.any() else ratio.new_ones(1)
        metrics = {
            "actor/pg_clipfrac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
            "actor/clipfrac_upper": masked_mean(((ratio > 1 + clip_high) & (advantages > 0)).to(mask.dtype), mask).item(),
            "actor/clipfrac_lower": masked_mean(((ratio < 1 - clip_low) & (advantages < 0)).to(mask.dtype), mask).item(),
            "actor/dual_clipfrac": masked_mean(dual_clipped.to(mask.dtype), mask).item(),
            "actor/ppo_kl": masked_mean(-log_ratio, mask).item(),
            "actor/ratio_mean": ratio_real.mean().item(),
            "actor/ratio_min": ratio_real.min().item(),
            "actor/ratio_max": ratio_real.max().item(),
        }
    return loss, metrics


def aggregate_loss(
    token_loss: torch.Tensor,
    mask: torch.Tensor,
    agg: str = "token-mean",
    num_global_tokens: float | None = None,
    num_global_sequences: float | None = None,
    seq_sum_norm: float | None = None,
) -> torch.Tensor:
    """Reduce a (B, T) loss matrix to a scalar; see `policy_loss` for the modes and the global denominators.

    Sequences without any response token count in none of the denominators.
    """
    if agg == "token-mean":
        denominator = mask.sum() if num_global_tokens is None else num_global_tokens
        return (token_loss * mask).sum() / denominator
    seq_tokens = mask.sum(-1)
    seq_loss = (token_loss * mask).sum(-1)
    if agg == "seq-mean-token-mean":
        seq_loss = seq_loss / (seq_tokens + 1e-8)
    elif agg == "seq-mean-token-sum-norm":
        seq_loss = seq_loss / (mask.shape[-1] if seq_sum_norm is None else seq_sum_norm)
    elif agg != "seq-mean-token-sum":
        raise ValueError(f"agg must be one of {LOSS_AGGREGATIONS}, got {agg!r}")
    has_tokens = (seq_tokens > 0).to(token_loss.dtype)
    num_sequences = has_tokens.sum() if num_global_sequences is None else num_global_sequences
    return (seq_loss * has_tokens).sum() / num_sequences


def group_index(group_ids: Sequence | torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids (prompt uids, ints, strings) to dense indices 0..K-1; returns (indices, K)."""
    if isinstance(group_ids, torch.Tensor):
        group_ids = group_ids.tolist()
    dense: dict = {}
    indices = [dense.setdefault(gid, len(dense)) for gid in group_ids]
    return torch.tensor(indices, dtype=torch.long), len(dense)


def group_advantages(
    scores: torch.Tensor, group_ids: Sequence | torch.Tensor, eps: float = 1e-6, norm_by_std: bool = True
) -> torch.Tensor:
    """Group-relative advantage (eq. 9): A_i = (R_i - mean(R_group)) / (std(R_group) + eps).

    `scores` (B,) are the rewards R_i of G responses per prompt; responses sharing a `group_ids` entry form one
    group. std is unbiased (N-1); a group of one gets mean 0 and std 1 (verl's convention). With
    `norm_by_std=False` the advantage is R_i - mean (Dr. GRPO). Returns (B,); constant-reward groups get 0.
    """
    index, num_groups = group_index(group_ids)
    scores = scores.to(torch.float32)
    count = torch.zeros(num_groups).index_add_(0, index, torch.ones_like(scores))
    mean = torch.zeros(num_groups).index_add_(0, index, scores) / count
    squared_dev = torch.zeros(num_groups).index_add_(0, index, (scores - mean[index]) ** 2)
    std = (squared_dev / (count - 1).clamp(min=1)).sqrt()
    singleton = count == 1
    mean = torch.where(singleton, torch.zeros_like(mean), mean)
    std = torch.where(singleton, torch.ones_like(std), std)
    centred = scores - mean[index]
    return centred / (std[index] + eps) if norm_by_std else centred


def overlong_penalty(
    lengths: torch.Tensor, max_len: int, buffer_len: int, factor: float = 1.0
) -> torch.Tensor:
    """Soft overlong punishment (eq. 13), added to the correctness reward:

        R_length(y) = 0                                  if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max

    `max_len` is L_max, `buffer_len` L_cache (paper: 20480 and 4096); `factor` scales it (verl's
    `penalty_factor`, 1.0 in the paper). `lengths` (B,) in tokens; returns (B,) float.
    """
    if not 0 < buffer_len <= max_len:
        raise ValueError(f"need 0 < buffer_len <= max_len, got buffer_len={buffer_len}, max_len={max_len}")
    lengths = lengths.to(torch.float32)
    return ((max_len - buffer_len - lengths) / buffer_len).clamp(min=-1.0, max=0.0) * factor


def mixed_groups(acc: torch.Tensor, group_ids: Sequence | torch.Tensor) -> torch.Tensor:
    """Dynamic sampling's constraint (eq. 11): 0 < |{o_i correct}| < G. Returns a (B,) keep-mask that is True
    for every response whose group is neither all correct nor all wrong."""
    index, num_groups = group_index(group_ids)
    correct = acc.to(torch.float32)
    count = torch.zeros(num_groups).index_add_(0, index, torch.ones_like(correct))
    group_accuracy = torch.zeros(num_groups).index_add_(0, index, correct) / count
    mixed = (group_accuracy > 0) & (group_accuracy < 1)
    return mixed[index]


def mask_truncated(response_mask: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """Overlong filtering (sec. 3.4): responses cut at the length limit contribute no loss.

    `response_mask` (B, T), `truncated` (B,) bool. Returns the mask with the rows of truncated responses zeroed.
    """
    return response_mask * (~truncated.bool()).unsqueeze(-1).to(response_mask.dtype)


def token_log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """log pi(token_t | context): logits (B, T, V) aligned with tokens (B, T) -> (B, T)."""
    log_z = torch.logsumexp(logits, dim=-1)
    return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - log_z


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Per-token entropy H = logsumexp(z) - sum softmax(z) * z: logits (B, T, V) -> (B, T)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)
