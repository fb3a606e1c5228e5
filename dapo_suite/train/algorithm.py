"""The DAPO objective as pure tensor functions: no configs, no I/O, no engines.

Every trainer of this project (the embedded one and the verl extension) computes its loss, advantages,
penalties and filters here. Shapes: B responses, T response tokens (right-padded, `response_mask` 1 on real
tokens), V vocabulary. Equations are numbered as in the DAPO paper (arXiv 2503.14476).

Besides DAPO's objective, its successors are registered by verl's names in `POLICY_LOSSES` (GSPO, CISPO, SAPO,
GMPO, Clip-Cov, KL-Cov) and other advantage estimators in `ADVANTAGE_ESTIMATORS` (RLOO, REINFORCE++-baseline,
pass@k, Lite PPO's batch-level std); each function gives its paper's equation and arXiv id.

Conventions the papers leave open, chosen to match verl 0.9.1 (tests/train/test_algorithm.py and
tests/train/test_successors.py check each):
- the log-ratio is clamped to [-20, 20] before `exp` (numerical safety; never active in a healthy run);
- the group standard deviation is the unbiased (N-1) one; a group of one response gets mean 0 and std 1;
- under gradient accumulation the token-mean divides by the token count of the whole mini-batch, passed as
  `num_global_tokens`, so the sum of micro-batch losses equals the loss of the full mini-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from dapo_suite.train.loss_hyperparameters import LOSS_DEFAULTS, LossHyperparameters

LOSS_AGGREGATIONS = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)
LOG_RATIO_LIMIT = 20.0


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is 1 (0 when the mask is empty). The 1e-8 is verl's: in float32 it leaves
    any count >= 1 unchanged, so Clip-Cov's covariance window selects bit-identically."""
    return (values * mask).sum() / (mask.sum() + 1e-8)


def _clip_fractions(ratio, advantages, mask, hp: LossHyperparameters) -> dict[str, float]:
    """Tokens whose ratio left the trust region in the direction the advantage pushes it (plots, ladder)."""
    upper = (ratio > 1 + hp.clip_high) & (advantages > 0)
    lower = (ratio < 1 - hp.clip_low) & (advantages < 0)
    return {
        "actor/clipfrac_upper": masked_mean(upper.to(mask.dtype), mask).item(),
        "actor/clipfrac_lower": masked_mean(lower.to(mask.dtype), mask).item(),
    }


def vanilla_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """DAPO's clipped surrogate with decoupled clip (DAPO eq. 8, arXiv 2503.14476; PPO arXiv 1707.06347):

        r_it = exp(log pi_theta - log pi_old),  L_it = -min(r_it A_it, clip(r_it, 1 - eps_low, 1 + eps_high)
        A_it)

    With `clip_c`, dual-clip PPO (arXiv 1912.09729) bounds the loss of A < 0 tokens at -clip_c * A.
    Token losses (B, T); metrics `actor/pg_clipfrac` (either side, as verl counts it) and
    `actor/dual_clipfrac`.
    """
    ratio = torch.exp((log_prob - old_log_prob).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - hp.clip_low, 1.0 + hp.clip_high)
    token_loss = torch.maximum(unclipped, clipped)
    dual_clipped = torch.zeros_like(mask, dtype=torch.bool)
    if hp.clip_c is not None:
        if hp.clip_c <= 1.0:
            raise ValueError(f"clip_c (dual-clip bound) must be > 1, got {hp.clip_c}")
        dual_bound = -advantages * hp.clip_c
        dual_clipped = (token_loss > dual_bound) & (advantages < 0)
        token_loss = torch.where(advantages < 0, torch.minimum(token_loss, dual_bound), token_loss)
    return token_loss, {
        "actor/pg_clipfrac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
        "actor/dual_clipfrac": masked_mean(dual_clipped.to(mask.dtype), mask).item(),
        **_clip_fractions(ratio, advantages, mask, hp),
    }


def gspo_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """GSPO (arXiv 2507.18071, eqs. 5-7 and GSPO-token eq. 13): one length-normalised ratio per sequence,

        s_i = exp( (1/|y_i|) sum_t (log pi_theta - log pi_old)_it )
        s_it = sg[s_i] * pi_theta(y_it) / sg[pi_theta(y_it)]     (value s_i, gradient of log pi_theta(y_it))
        L_it = -min(s_it A_it, clip(s_it, 1 - eps_low, 1 + eps_high) A_it)

    log s_it is capped at 10 (verl's guard); |y_i| >= 1. The paper clips at eps 3e-4 / 4e-4 and averages over
    sequences (`seq-mean-token-mean`); any aggregation works. Token losses (B, T).
    """
    seq_log_ratio = ((log_prob - old_log_prob) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    log_seq_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(log_seq_ratio.clamp(max=10.0))
    unclipped = -advantages * seq_ratio
    clipped = -advantages * seq_ratio.clamp(1.0 - hp.clip_low, 1.0 + hp.clip_high)
    return torch.maximum(unclipped, clipped), {
        "actor/pg_clipfrac": masked_mean((clipped > unclipped).to(mask.dtype), mask).item(),
        **_clip_fractions(seq_ratio.detach(), advantages, mask, hp),
    }


def cispo_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """CISPO (MiniMax-M1, arXiv 2506.13585, eq. 4): clip the importance weight, never the gradient,

        L_it = -sg[clip(r_it, 1 - eps_low, 1 + eps_high)] * A_it * log pi_theta(y_it)

    so every token keeps a gradient (PPO-clip zeroes it outside the trust region). The paper sets eps_low
    large (no lower bound) and tunes eps_high. Token losses (B, T); `actor/pg_clipfrac`: weights clipped.
    """
    ratio = torch.exp((log_prob - old_log_prob).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    weight = ratio.clamp(1.0 - hp.clip_low, 1.0 + hp.clip_high)
    return -weight.detach() * advantages * log_prob, {
        "actor/pg_clipfrac": masked_mean((ratio != weight).to(mask.dtype), mask).item(),
        **_clip_fractions(ratio, advantages, mask, hp),
    }


def sapo_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """SAPO (arXiv 2511.20347, eqs. 3-5): a smooth, temperature-controlled gate instead of a hard clip,

        f(r; tau) = sigmoid(tau (r - 1)) * 4 / tau,   tau_it = tau_pos if A_it > 0 else tau_neg
        L_it = -f(r_it; tau_it) * A_it

    (gradient 4 r sigma(1 - sigma) A: r at r = 1, fading smoothly off-policy; tau_neg > tau_pos damps
    negative updates faster). Sequence-level mean only (`seq-mean-token-mean`, as verl forces). Token losses.
    """
    ratio = torch.exp((log_prob - old_log_prob).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT))
    tau = torch.where(advantages > 0, advantages.new_tensor(hp.tau_pos), advantages.new_tensor(hp.tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * advantages, {"actor/pg_clipfrac": 0.0}


def geo_mean_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """GMPO (arXiv 2507.20673, eq. 4): the geometric mean of token ratios, each clipped in log space,

        l_it = sgn(A) * min(sgn(A) (log r_it), sgn(A) clip(log r_it, -eps_low, eps_high))
        L_i  = -A_i * exp( (1/|o_i|) sum_t l_it )          A_i = mean of A over o_i's tokens

    (paper: eps 0.4 on each side). Sequence losses (B,); their mean counts every row of the batch, an empty
    response (L_i = 0) included, as verl does. `actor/pg_clipfrac`: clipped with A > 0.
    """
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    clipped = log_ratio.clamp(-hp.clip_low, hp.clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clipped)
    tokens = mask.sum(-1) + 1e-8
    seq_ratio = torch.exp((pessimistic * mask).sum(-1) / tokens)
    seq_advantage = (advantages * mask).sum(-1) / tokens
    was_clipped = (log_ratio != clipped).to(mask.dtype)
    return -seq_advantage * seq_ratio, {
        "actor/pg_clipfrac": masked_mean(was_clipped * (advantages > 0), mask).item(),
        "actor/clipfrac_upper": masked_mean(was_clipped * (advantages > 0), mask).item(),
        "actor/clipfrac_lower": masked_mean(was_clipped * (advantages < 0), mask).item(),
    }


def _covariance(advantages: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token centred product (A - mean A)(log pi - mean log pi) over the batch's response tokens: the
    covariance whose sum drives the entropy change (arXiv 2505.22617, eq. 8). (B, T), no gradient."""
    log_prob = log_prob.detach()
    return (advantages - masked_mean(advantages, mask)) * (log_prob - masked_mean(log_prob, mask))


def clip_cov_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """Clip-Cov (arXiv 2505.22617, eq. 11): PPO-clip, plus the gradient of a few high-covariance tokens cut,

        candidates = { t unclipped by PPO : omega_low < Cov_t < omega_high }
        drop       = max(1, floor(r * N)) of them, drawn uniformly (torch.randperm on torch's global
        generator) L_it = PPO-clip_it * (0 if t in drop else 1)

    N = response tokens of the batch; paper and verl: r 2e-4, omega 1 and 5. No dual clip, ratio unclamped (as
    verl). Token losses (B, T); `actor/pg_clipfrac`: share dropped.
    """
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - hp.clip_low, 1.0 + hp.clip_high)
    with torch.no_grad():
        covariance = _covariance(advantages, log_prob, mask)
        real = mask > 0
        window = (covariance > hp.clip_cov_lb) & (covariance < hp.clip_cov_ub) & real & ~(clipped > unclipped)
        candidates = torch.nonzero(window)
        budget = max(int(hp.clip_cov_ratio * mask.sum().item()), 1)
        if len(candidates):
            candidates = candidates[torch.randperm(len(candidates))[:budget]]
        keep = torch.ones_like(advantages)
        keep[candidates[:, 0], candidates[:, 1]] = 0
    return torch.maximum(unclipped, clipped) * keep, {
        "actor/pg_clipfrac": masked_mean((keep == 0).to(mask.dtype), mask).item(),
        **_clip_fractions(ratio.detach(), advantages, mask, hp),
    }


def kl_cov_loss(log_prob, old_log_prob, advantages, mask, hp: LossHyperparameters):
    """KL-Cov (arXiv 2505.22617, eq. 12): the plain policy gradient, plus a KL penalty on the top-k tokens by
    covariance:

        L_it = -r_it A_it + (beta |log r_it| if t in top-k Cov else 0),    k = max(1, floor(kl_cov_ratio * N))

    beta = `ppo_kl_coef` (paper 1; verl's default 0.1), kl_cov_ratio 2e-3 (7B) / 2e-4 (32B). No clipping.
    Token losses (B, T); `actor/ppo_kl_abs` = mean |log r|.
    """
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    policy_gradient = -advantages * ratio
    with torch.no_grad():
        real = mask > 0
        flat_real = torch.nonzero(real.reshape(-1), as_tuple=True)[0]
        penalised = torch.zeros(mask.numel(), dtype=torch.bool)
        if len(flat_real):
            # Centred over the real tokens' own values (the same numbers verl ranks), on the CPU.
            adv = advantages[real].reshape(-1).cpu()
            logp = log_prob.detach()[real].reshape(-1).cpu()
            covariance = (adv - adv.mean()) * (logp - logp.mean())
            top = torch.topk(covariance, max(1, int(len(covariance) * hp.kl_cov_ratio)), largest=True).indices
            penalised[flat_real.cpu()[top]] = True
        penalised = penalised.reshape(mask.shape).to(log_prob.device)
    token_loss = torch.where(penalised, policy_gradient + hp.ppo_kl_coef * log_ratio.abs(), policy_gradient)
    return token_loss, {
        "actor/pg_clipfrac": masked_mean(penalised.to(mask.dtype), mask).item(),
        "actor/ppo_kl_abs": masked_mean(log_ratio.detach().abs(), mask).item(),
    }


PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, LossHyperparameters],
    tuple[torch.Tensor, dict[str, float]],
]


@dataclass(frozen=True)
class PolicyLossMode:
    """A registered objective: its function (token losses (B, T), or sequence losses (B,) when
    `per_sequence`), the aggregations it is defined for, and its paper."""

    fn: PolicyLossFn
    aggregations: tuple[str, ...] = LOSS_AGGREGATIONS
    per_sequence: bool = False
    paper: str = ""


# verl 0.9.1's names (`actor_rollout_ref.actor.policy_loss.loss_mode`).
POLICY_LOSSES: dict[str, PolicyLossMode] = {
    "vanilla": PolicyLossMode(vanilla_loss, paper="2503.14476"),
    "gspo": PolicyLossMode(gspo_loss, paper="2507.18071"),
    "cispo": PolicyLossMode(cispo_loss, paper="2506.13585"),
    "sapo": PolicyLossMode(sapo_loss, aggregations=("seq-mean-token-mean",), paper="2511.20347"),
    "geo_mean": PolicyLossMode(
        geo_mean_loss, aggregations=("seq-mean-token-mean",), per_sequence=True, paper="2507.20673"
    ),
    "clip_cov": PolicyLossMode(clip_cov_loss, paper="2505.22617"),
    "kl_cov": PolicyLossMode(kl_cov_loss, paper="2505.22617"),
}


def policy_loss_mode(name: str) -> PolicyLossMode:
    """The registered objective `name`; an unknown name lists the valid ones."""
    if name not in POLICY_LOSSES:
        raise ValueError(f"unknown loss_mode {name!r}; valid: {', '.join(POLICY_LOSSES)}")
    return POLICY_LOSSES[name]


def policy_loss(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    hp: LossHyperparameters = LOSS_DEFAULTS,
    *,
    num_global_tokens: float | None = None,
    num_global_sequences: float | None = None,
    seq_sum_norm: float | None = None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The policy loss of `hp.loss_mode` (a name of `POLICY_LOSSES`, verl's), reduced to a scalar to minimise.

    Default: DAPO's clipped surrogate (`vanilla_loss`, eq. 8): Clip-Higher is `clip_high > clip_low` (paper
    0.2 / 0.28); `clip_c` adds dual-clip. The other modes' equations are in their functions; every knob is
    described in `LossHyperparameters`. `hp.loss_agg` chooses the reduction: `token-mean` (DAPO, sec. 3.3),
    `token-sum` (no denominator), `seq-mean-token-mean` (GRPO's sample-level mean), `seq-mean-token-sum`,
    `seq-mean-token-sum-norm` (Dr. GRPO: sum over tokens / `seq_sum_norm`, default T); a mode defined for
    fewer aggregations rejects the others. `num_global_tokens` / `num_global_sequences` replace this batch's
    own counts as denominators when it is one micro-batch of a larger mini-batch. `rollout_is_weights` (B, T),
    rollout-correction weights (see `rollout_correction.py`), multiply each token's loss (per-sequence modes:
    their geometric mean per sequence).

    Shapes: `log_prob`, `old_log_prob`, `response_mask` (B, T); `advantages` (B, T) or (B,).
    Returns the scalar loss and metrics: the mode's clip fractions (`actor/pg_clipfrac` as verl counts it;
    `actor/clipfrac_upper` / `actor/clipfrac_lower`: tokens held back going up with A > 0 / down with A < 0),
    `actor/ppo_kl` (mean of log pi_old - log pi_theta, verl's approx KL) and ratio statistics over response
    tokens.
    """
    mode = policy_loss_mode(hp.loss_mode)
    if hp.loss_agg not in mode.aggregations:
        raise ValueError(
            f"loss_mode {hp.loss_mode!r} aggregates only as {' / '.join(mode.aggregations)} (as verl "
            f"0.9.1 does), got loss_agg={hp.loss_agg!r}"
        )
    mask = response_mask.to(log_prob.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1).expand_as(log_prob)
    losses, metrics = mode.fn(log_prob, old_log_prob, advantages, mask, hp)
    if mode.per_sequence:
        if rollout_is_weights is not None:  # geometric mean of the token weights, as the ratio is one
            log_weights = (torch.log(rollout_is_weights + 1e-10) * mask).sum(-1) / (mask.sum(-1) + 1e-8)
            losses = losses * torch.exp(log_weights)
        loss = losses.sum() / (losses.shape[0] if num_global_sequences is None else num_global_sequences)
    else:
        if rollout_is_weights is not None:
            losses = losses * rollout_is_weights
        loss = aggregate_loss(
            losses, mask, hp.loss_agg, num_global_tokens, num_global_sequences, seq_sum_norm
        )

    with torch.no_grad():
        log_ratio = (log_prob - old_log_prob).clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
        real = mask.bool()
        ratio_real = torch.exp(log_ratio[real]) if real.any() else log_prob.new_ones(1)
        metrics = {
            "actor/clipfrac_upper": 0.0,
            "actor/clipfrac_lower": 0.0,
            **metrics,
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
    if agg == "token-sum":
        return (token_loss * mask).sum()
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


@dataclass(frozen=True)
class ScoredGroups:
    """A batch's rewards by group, what every advantage estimator reads: `scores` (B,) float32, `index` (B,)
    each response's group 0..K-1, per group (K,) `count`, `mean` and unbiased (N-1) `std` (a group of one:
    mean 0, std 1, verl's convention), and `lengths` (B,), response tokens, for estimators that weigh by
    them."""

    scores: torch.Tensor
    index: torch.Tensor
    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    lengths: torch.Tensor | None = None

    @classmethod
    def of(
        cls, scores: torch.Tensor, group_ids: Sequence | torch.Tensor, lengths: torch.Tensor | None = None
    ) -> ScoredGroups:
        """Group `scores` (B,) by `group_ids` (prompt uids, ints, strings; one per response)."""
        scores = scores.to(torch.float32)
        index, num_groups = group_index(group_ids)
        count = torch.zeros(num_groups).index_add_(0, index, torch.ones_like(scores))
        mean = torch.zeros(num_groups).index_add_(0, index, scores) / count
        squared_dev = torch.zeros(num_groups).index_add_(0, index, (scores - mean[index]) ** 2)
        std = (squared_dev / (count - 1).clamp(min=1)).sqrt()
        singleton = count == 1
        mean, std = torch.where(singleton, 0.0, mean), torch.where(singleton, 1.0, std)
        return cls(scores, index, count, mean, std, lengths)

    def centred(self) -> torch.Tensor:
        """R_i - mean(R_group) (B,)."""
        return self.scores - self.mean[self.index]


def group_advantages(groups: ScoredGroups, norm: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage (DAPO eq. 9, GRPO): A_i = (R_i - mean(R_group)) / (std + eps), where std is

        "group": the std of the response's group (GRPO, DAPO);
        "batch": the std of all rewards of the batch (Lite PPO, arXiv 2508.08221: group mean, batch std);
        "none":  no division, A_i = R_i - mean (Dr. GRPO, arXiv 2503.20783).

    `groups` holds the rewards R_i of G responses per prompt (groups of one: mean 0, std 1). Returns (B,).
    """
    divisors = {
        "group": lambda: groups.std[groups.index] + eps,
        "batch": lambda: groups.scores.std() + eps,
        "none": lambda: 1.0,
    }
    return groups.centred() / divisors[norm]()


def rloo_advantages(groups: ScoredGroups, norm: str = "none", eps: float = 1e-6) -> torch.Tensor:
    """RLOO (arXiv 2402.14740, eq. 6): the baseline of response i is the mean of the other G-1 of its group,

        A_i = R_i - (1/(G-1)) sum_{j != i} R_j = G/(G-1) * (R_i - mean(R_group))

    A group of one keeps A_i = R_i (verl). No std division (`norm` "none" only); `eps` unused. (B,).
    """
    count = groups.count
    scale = torch.where(count > 1, count / (count - 1).clamp(min=1), 1.0)
    return groups.centred() * scale[groups.index]


def reinforce_pp_baseline_advantages(
    groups: ScoredGroups, norm: str = "batch", eps: float = 1e-6
) -> torch.Tensor:
    """REINFORCE++-baseline (arXiv 2501.03262, sec. 3): subtract the group mean, then whiten over the batch's
    tokens (each response counts once per response token, as verl's `masked_whiten`):

        c_i = R_i - mean(R_group),   mu = sum_i |o_i| c_i / sum_i |o_i|,
        var = sum_i |o_i| (c_i - mu)^2 / (sum_i |o_i| - 1),   A_i = (c_i - mu) / sqrt(var + 1e-8)

    `groups.lengths` (B,) are |o_i| (at least 2 tokens in all); `norm` "batch" only; `eps` unused. (B,).
    """
    centred = groups.centred()
    weight = groups.lengths.to(torch.float32)
    tokens = weight.sum()
    if tokens < 2:
        raise ValueError(
            f"reinforce_plus_plus_baseline whitens over the batch's tokens and needs >= 2, got {tokens}"
        )
    mu = (centred * weight).sum() / (tokens + 1e-8)
    var = ((centred - mu) ** 2 * weight).sum() / (tokens + 1e-8) * tokens / (tokens - 1)
    return (centred - mu) * torch.rsqrt(var + 1e-8)


def passk_advantages(groups: ScoredGroups, norm: str = "group", eps: float = 1e-6) -> torch.Tensor:
    """Pass@k training (arXiv 2503.19595, leave-one-out max): only each group's best response learns,

        A_best = (R_max - R_second_max) / (std(R_group) + eps)   (no division with `norm` "none"),  others 0.

    Every group needs >= 2 responses; ties for the best give 0. Returns (B,).
    """
    if (groups.count < 2).any():
        raise ValueError("grpo_passk needs at least 2 responses per group")
    advantages = torch.zeros_like(groups.scores)
    for group in range(len(groups.count)):
        members = torch.nonzero(groups.index == group).squeeze(-1)
        top, position = torch.topk(groups.scores[members], 2)
        gap = top[0] - top[1]
        advantages[members[position[0]]] = gap / (groups.std[group] + eps) if norm == "group" else gap
    return advantages


AdvantageFn = Callable[[ScoredGroups, str, float], torch.Tensor]


@dataclass(frozen=True)
class AdvantageEstimator:
    """A registered estimator: its function (the batch's `ScoredGroups`, norm, eps) -> (B,), the
    normalisations it is defined for (the first is its own), and its paper."""

    fn: AdvantageFn
    norms: tuple[str, ...]
    paper: str


# verl 0.9.1's names (`algorithm.adv_estimator`).
ADVANTAGE_ESTIMATORS: dict[str, AdvantageEstimator] = {
    "grpo": AdvantageEstimator(group_advantages, ("group", "batch", "none"), "2402.03300"),
    "rloo": AdvantageEstimator(rloo_advantages, ("none",), "2402.14740"),
    "reinforce_plus_plus_baseline": AdvantageEstimator(
        reinforce_pp_baseline_advantages, ("batch",), "2501.03262"
    ),
    "grpo_passk": AdvantageEstimator(passk_advantages, ("group", "none"), "2503.19595"),
}


def advantage_estimator(name: str) -> AdvantageEstimator:
    """The registered estimator `name`; an unknown name lists the valid ones."""
    if name not in ADVANTAGE_ESTIMATORS:
        raise ValueError(f"unknown adv_estimator {name!r}; valid: {', '.join(ADVANTAGE_ESTIMATORS)}")
    return ADVANTAGE_ESTIMATORS[name]


def compute_advantages(
    name: str,
    scores: torch.Tensor,
    group_ids: Sequence | torch.Tensor,
    lengths: torch.Tensor,
    norm: str | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Outcome advantages (B,) of estimator `name` (see `ADVANTAGE_ESTIMATORS`); `norm` None = its own."""
    estimator = advantage_estimator(name)
    norm = norm or estimator.norms[0]
    if norm not in estimator.norms:
        raise ValueError(
            f"adv_estimator {name!r} normalises only as {' / '.join(estimator.norms)}, got {norm!r}"
        )
    return estimator.fn(ScoredGroups.of(scores, group_ids, lengths), norm, eps)


def soft_overlong_penalty(
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


def tool_call_shaping(
    scores: torch.Tensor, correct: torch.Tensor, calls: torch.Tensor, bonus: float, cap: float
) -> torch.Tensor:
    """ReTool's reward for tool use (arXiv 2504.11536; its verl recipe's `compute_score`): a wrong answer's
    score gains `bonus` per tool call, and stays at most `cap`; a right answer's is unchanged:

        R(y) = R_correct(y)                              if y is right
             = min(cap, R_correct(y) + bonus * calls(y)) otherwise

    The recipe writes calls as (num_turns - 2) / 2 over verl's turn count, with bonus 0.1 and cap -0.6.
    `scores`, `correct` (bool) and `calls` are (B,); returns (B,) float."""
    shaped = torch.clamp(scores + bonus * calls.to(scores.dtype), max=cap)
    return torch.where(correct.bool(), scores, shaped)


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

    `response_mask` (B, T), `truncated` (B,) bool. Returns the mask with the rows of truncated responses
    zeroed.
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
