"""What verl imports from dapo-suite at run time: the overlong-filter policy losses (DAPO sec. 3.4).

verl 0.9.1 has no overlong filtering. This module adds it through verl's documented extension points:
- `register_policy_loss("dapo_overlong_filter")` adds DAPO's clipped loss over non-truncated responses to
  verl's registry, selected by `actor_rollout_ref.actor.policy_loss.loss_mode=dapo_overlong_filter`; every
  successor (`gspo`, `cispo`, ...) gets its own wrapper, `dapo_overlong_filter_<mode>`
  (`keys.overlong_filter_loss_name`);
- verl imports this module in every actor worker because the override list sets
  `actor_rollout_ref.model.external_lib=dapo_suite.train.verl.extensions` (`HFModelConfig.__post_init__` calls
  `verl.utils.import_utils.import_external_libs` on it), so dapo_suite must be importable on every node.

How the truncation flag reaches the loss: verl passes only `response_mask` (B, T), padded to the longest
response of the micro-batch, not to L_max. A response is truncated when it filled L_max tokens (the sampler
stopped it before EOS), i.e. `response_mask.sum(-1) >= L_max`. L_max comes from the environment variable
`DAPO_SUITE_MAX_RESPONSE_LENGTH`, which the override list sets for every Ray worker through
`+ray_kwargs.ray_init.runtime_env.env_vars` (verl's actor config, the `config` a loss receives, has no field
for it: see the comment on `keys.VERL_KEYS`' max_response_length row). Without it the loss refuses to run
rather than filter nothing.
A response whose EOS lands exactly on token L_max is counted as truncated too (indistinguishable from the
mask).

Deviation from the embedded trainer: verl computes the token-mean denominator (`batch_num_tokens`, the valid
tokens of the whole mini-batch across data-parallel ranks) before the loss runs, so truncated tokens stay in
the denominator. The kept tokens' gradient is therefore scaled by kept/all tokens of the mini-batch; the
direction is the same, and AdamW's update is nearly invariant to that scale.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from verl.trainer.ppo.core_algos import get_policy_loss_fn, register_policy_loss

from dapo_suite.train.algorithm import POLICY_LOSSES, mask_truncated
from dapo_suite.train.verl.keys import (
    MAX_RESPONSE_LENGTH_ENV,
    OVERLONG_FILTER_LOSS,
    overlong_filter_loss_name,
)


def max_response_length() -> int:
    """L_max as the launcher passed it to this worker."""
    raw = os.environ.get(MAX_RESPONSE_LENGTH_ENV)
    if not raw:
        raise RuntimeError(
            f"policy loss {OVERLONG_FILTER_LOSS!r} needs {MAX_RESPONSE_LENGTH_ENV} (L_max) in the "
            "worker environment: launch through `dapo-suite train --backend verl`, or add "
            f"+ray_kwargs.ray_init.runtime_env.env_vars.{MAX_RESPONSE_LENGTH_ENV}=<data.max_response_length>"
        )
    return int(raw)


def truncated_rows(response_mask: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B,) bool: responses that used all L_max tokens, i.e. were cut by the length limit."""
    return response_mask.sum(dim=-1) >= max_len


def overlong_filtered(loss_mode: str):
    """verl's registered `loss_mode` over the non-truncated rows only: same signature and return value as
    verl's losses (tensors (B, T)), plus the metric `actor/overlong_filtered_frac` (share of rows masked)."""
    inner = get_policy_loss_fn(loss_mode)

    def loss(
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        loss_agg_mode: str = "token-mean",
        config: Any = None,
        rollout_is_weights: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        truncated = truncated_rows(response_mask, max_response_length())
        kept_mask = mask_truncated(response_mask, truncated)
        filtered = {
            "actor/overlong_filtered_frac": truncated.float().mean().item(),
            # the model's own tokens a response (a tool's are 0 in the mask): response_length/mean counts both
            "actor/model_tokens_mean": response_mask.sum(dim=-1).float().mean().item(),
        }
        if not kept_mask.any():
            # Every row was cut: nothing to learn from, and token-mean over zero tokens would be 0/0.
            zero = (log_prob * 0.0).sum()
            return zero, {
                "actor/pg_clipfrac": 0.0,
                "actor/ppo_kl": 0.0,
                "actor/pg_clipfrac_lower": 0.0,
                **filtered,
            }
        value, metrics = inner(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=advantages,
            response_mask=kept_mask,
            loss_agg_mode=loss_agg_mode,
            config=config,
            rollout_is_weights=rollout_is_weights,
        )
        return value, {**metrics, **filtered}

    return loss


for _mode in POLICY_LOSSES:
    register_policy_loss(overlong_filter_loss_name(_mode))(overlong_filtered(_mode))
