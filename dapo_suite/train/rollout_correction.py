"""Rollout correction: importance weights and rejection between the sampler's policy and the trainer's.

The engine that samples (bf16 kernels, vLLM) does not compute exactly the probabilities the trainer
differentiates (fp32), so the samples are slightly off-policy even before any update. With
rho_t = pi_old(y_t) / pi_rollout(y_t) (trainer's recomputed log-prob minus the sampler's, per token):

- TIS, truncated importance sampling (Yao et al. 2025, https://fengyao.notion.site/off-policy-rl):
  w = min(rho, C), per token or per sequence (rho_seq = prod_t rho_t);
- MIS / IcePop (Ring-1T, arXiv 2510.18855): w = rho inside [lower, upper], 0 outside (the token or sequence
  is masked rather than down-weighted); chosen by a threshold written "lower_upper";
- rejection (Liu et al. 2025, "When Speed Kills Stability", https://richardli.xyz/rl-collapse): drop tokens or
  whole sequences whose divergence estimate exceeds a bound.

The weights multiply each token's policy loss (`algorithm.policy_loss(rollout_is_weights=...)`); a rejected
token leaves the loss mask. Pure functions, names and numerics as verl 0.9.1's `rollout_corr_helper`
(`compute_rollout_correction_weights`, `compute_rollout_rejection_mask`); tests/train/test_successors.py
checks both. Shapes: `log_ratio` and `response_mask` (B, T), log_ratio = log pi_old - log pi_rollout.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from dapo_suite.train.algorithm import masked_mean

SAFETY_BOUND = 20.0  # |log rho| is clamped here before exp (exp(20) ~ 5e8)
IS_LEVELS = ("token", "sequence")

# Per-token divergence estimates of KL(pi_rollout || pi_old) from the log-ratio (Schulman's k1, k2, k3).
DIVERGENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda log_ratio: -log_ratio,
    "k2": lambda log_ratio: 0.5 * log_ratio**2,
    "k3": lambda log_ratio: torch.exp(log_ratio) - 1.0 - log_ratio,
}


def _sequence_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    top = values.masked_fill(~mask.bool(), float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(top), 0.0, top)  # an empty response scores 0


# How a criterion pools the per-token divergence: (B, T) -> (B, T) (token) or (B,) (sequence).
POOLINGS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "token": lambda values, mask: values,
    "seq_sum": lambda values, mask: (values * mask).sum(-1),
    "seq_mean": lambda values, mask: (values * mask).sum(-1) / (mask.sum(-1) + 1e-8),
    "seq_max": _sequence_max,
}
# Rejection criteria, verl's names: pooling_divergence (a max of k1 = -log rho is not a divergence).
REJECTION_CRITERIA = tuple(
    f"{pool}_{k}" for pool in POOLINGS for k in DIVERGENCES if (pool, k) != ("seq_max", "k1")
)


def parse_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """ "C" or C -> (C, None): TIS; "lower_upper" -> (upper, lower): MIS/IcePop. Bounds are ratios > 0."""
    text = str(spec).strip()
    lower_text, _, upper_text = text.rpartition("_")
    try:
        upper, lower = float(upper_text), float(lower_text) if lower_text else None
    except ValueError:
        raise ValueError(
            f"rollout_is_threshold {spec!r}: write an upper bound (2.0, TIS) or lower_upper (0.5_5.0, IcePop)"
        ) from None
    if upper <= 0 or (lower is not None and not 0 < lower <= upper):
        raise ValueError(f"rollout_is_threshold {spec!r}: need 0 < lower <= upper")
    return upper, lower


def parse_is_settings(level: str, threshold: str | float) -> tuple[float, float | None]:
    """Check the IS level; returns the threshold's (upper, lower) (see `parse_is_threshold`)."""
    if level not in IS_LEVELS:
        raise ValueError(f"rollout_is {level!r} is not one of {', '.join(IS_LEVELS)}")
    return parse_is_threshold(threshold)


def correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    level: str = "token",
    threshold: str | float = 2.0,
    batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights rho = pi_old / pi_rollout for the policy loss, truncated (TIS) or masked (IcePop):

        token:    rho_t = exp(clamp(log_ratio_t, +-20))
        sequence: rho_t = exp(clamp(sum_t log_ratio_t, +-20)) for every token of the sequence
        TIS ("C"):           w = min(rho, C)
        IcePop ("lo_hi"):    w = rho if lo <= rho <= hi else 0

    With `batch_normalize`, w is divided by its mean (over tokens, or over sequences at sequence level) when
    that mean exceeds 1e-8. Returns detached (B, T) weights (0 on padding) and metrics
    `rollout_corr/is_weight_mean`, `_max` (over real tokens, before normalisation),
    `rollout_corr/is_clipped_frac` (tokens whose rho left [lower, upper]: truncated by TIS, zeroed by IcePop).
    """
    upper, lower = parse_is_settings(level, threshold)
    mask = response_mask.to(log_ratio.dtype)
    if level == "sequence":
        log_ratio = (log_ratio * mask).sum(-1, keepdim=True).expand_as(log_ratio)
    rho = torch.exp(log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)) * mask
    if lower is None:
        weights = rho.clamp(max=upper)
        outside = rho > upper
    else:
        outside = (rho < lower) | (rho > upper)
        weights = torch.where(outside, 0.0, rho)
    weights = weights.detach()
    real = mask.bool()
    metrics = {
        "rollout_corr/is_weight_mean": masked_mean(weights, mask).item(),
        "rollout_corr/is_weight_max": weights[real].max().item() if real.any() else 0.0,
        "rollout_corr/is_clipped_frac": masked_mean(outside.to(mask.dtype), mask).item(),
    }
    if batch_normalize:
        if level == "token":
            mean = masked_mean(weights, mask)
        else:
            has_tokens = (mask.sum(-1) > 0).to(mask.dtype)
            per_sequence = (weights * mask).sum(-1) / (mask.sum(-1) + 1e-8)
            mean = (per_sequence * has_tokens).sum() / has_tokens.sum().clamp(min=1e-8)
        if mean > 1e-8:
            weights = weights / mean
    return weights, metrics


def parse_rs_thresholds(criteria: list[str], spec: str | float | None) -> dict[str, tuple[float, float]]:
    """Bounds per criterion from "t" (shared) or "t1,t2,..." (one each). k1 criteria bound the ratio on both
    sides ("lo_hi", or "hi" meaning 1/hi_hi), others take one upper bound. Returns {criterion: (lower, upper)}
    with lower unused (0) for k2/k3."""
    if spec is None:
        raise ValueError("rollout_rs_threshold is required with rollout_rs (e.g. 0.5_2.0 for seq_mean_k1)")
    parts = [part.strip() for part in str(spec).split(",") if part.strip()]
    if len(parts) not in (1, len(criteria)):
        raise ValueError(
            f"rollout_rs_threshold {spec!r}: give one bound, or one per criterion ({len(criteria)})"
        )
    bounds = {}
    for criterion, part in zip(criteria, parts * len(criteria) if len(parts) == 1 else parts, strict=False):
        lower_text, _, upper_text = part.rpartition("_")
        try:
            upper = float(upper_text)
            lower = float(lower_text) if lower_text else (1.0 / upper if criterion.endswith("k1") else 0.0)
        except (ValueError, ZeroDivisionError):
            raise ValueError(f"rollout_rs_threshold {part!r} for {criterion} is not a number") from None
        if lower_text and not criterion.endswith("k1"):
            raise ValueError(
                f"rollout_rs_threshold {part!r}: {criterion} takes one upper bound, not lower_upper"
            )
        if upper <= 0 or lower < 0 or (criterion.endswith("k1") and not 0 < lower <= upper):
            raise ValueError(
                f"rollout_rs_threshold {part!r} for {criterion}: need positive bounds, lower <= upper"
            )
        bounds[criterion] = (lower, upper)
    return bounds


def parse_rs_settings(criteria: str, thresholds: str | float | None) -> dict[str, tuple[float, float]]:
    """Comma-separated criteria (duplicates dropped, order kept) -> {criterion: (lower, upper)}."""
    names = list(dict.fromkeys(name.strip() for name in criteria.split(",") if name.strip()))
    unknown = [name for name in names if name not in REJECTION_CRITERIA]
    if unknown or not names:
        raise ValueError(f"rollout_rs {criteria!r}: valid criteria are {', '.join(REJECTION_CRITERIA)}")
    return parse_rs_thresholds(names, thresholds)


def rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    criteria: str,
    thresholds: str | float | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with tokens (token_*) or whole sequences (seq_*) dropped where the divergence
    estimate leaves its bound; every criterion of the comma-separated `criteria` must pass:

        k1 = -log rho (kept if log lo <= k1 <= log hi),  k2 = (log rho)^2 / 2,  k3 = rho - 1 - log rho (kept
        if <= t)

    pooled per token, or per sequence as sum / mean / max over its tokens (log rho clamped to +-20).
    Returns the (B, T) mask and metrics `rollout_corr/rejected_frac` (tokens) and
    `rollout_corr/rejected_seq_frac` (responses with any token dropped).
    """
    bounds = parse_rs_settings(criteria, thresholds)
    mask = response_mask.to(log_ratio.dtype)
    safe = log_ratio.clamp(-SAFETY_BOUND, SAFETY_BOUND)
    keep = torch.ones_like(mask, dtype=torch.bool)
    for name in bounds:
        pool, divergence = name.rsplit("_", 1)
        statistic = POOLINGS[pool](DIVERGENCES[divergence](safe), mask)
        lower, upper = bounds[name]
        if divergence == "k1":
            passes = (statistic >= math.log(lower)) & (statistic <= math.log(upper))
        else:
            passes = statistic <= upper
        keep &= passes if pool == "token" else passes.unsqueeze(-1).expand_as(keep)
    kept = response_mask * keep.to(response_mask.dtype)
    dropped = mask.bool() & ~keep
    return kept, {
        "rollout_corr/rejected_frac": masked_mean(dropped.to(mask.dtype), mask).item(),
        "rollout_corr/rejected_seq_frac": dropped.any(-1).to(mask.dtype).mean().item(),
    }


def rollout_correction(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (None when `rollout_is` is None) and the rejection-filtered mask between the trainer's
    recomputed log pi_old and the sampler's log pi_rollout, each (B, T); arguments are verl's
    `algorithm.rollout_correction.*`. Metrics add `rollout_corr/kl` (mean log pi_rollout - log pi_old) and
    `rollout_corr/k3_kl`, and `rollout_corr/masked_frac`: tokens that carry no loss (weight 0 or rejected)."""
    log_ratio = old_log_prob - rollout_log_prob
    mask = response_mask.to(log_ratio.dtype)
    metrics = {
        "rollout_corr/kl": masked_mean(-log_ratio, mask).item(),
        "rollout_corr/k3_kl": masked_mean(DIVERGENCES["k3"](log_ratio.clamp(max=SAFETY_BOUND)), mask).item(),
    }
    weights = None
    if rollout_is is not None:
        weights, weight_metrics = correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(weight_metrics)
    kept = response_mask
    if rollout_rs is not None:
        kept, rejection_metrics = rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rejection_metrics)
    carries_loss = kept.bool() if weights is None else kept.bool() & (weights > 0)
    metrics["rollout_corr/masked_frac"] = masked_mean(
        (mask.bool() & ~carries_loss).to(mask.dtype), mask
    ).item()
    return weights, kept, metrics
