"""The overlong-filter policy loss, called the way verl 0.9.1 calls a registered loss
(workers/utils/losses.py)."""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla, get_policy_loss_fn
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.import_utils import import_external_libs

from dapo_suite.train.config import resolve_config
from dapo_suite.train.verl import EXTENSION_MODULE, OVERLONG_FILTER_LOSS, Hardware, build_overrides, compose

L_MAX = 6


@pytest.fixture(scope="module")
def actor_config():
    """verl's ActorConfig built from the composed `dapo` override list, as the actor worker builds it."""
    config = resolve_config(
        ["dapo"],
        {
            "model": "Qwen/Qwen2.5-32B",
            "max_response_length": L_MAX,
            "overlong_buffer_len": 2,
            "backend": "verl",
        },
    )
    overrides = build_overrides(config, Hardware(1, 1))
    assert f"actor_rollout_ref.model.external_lib={EXTENSION_MODULE}" in overrides
    assert f"actor_rollout_ref.actor.policy_loss.loss_mode={OVERLONG_FILTER_LOSS}" in overrides
    cfg = compose(overrides)
    return omega_conf_to_dataclass(cfg.actor_rollout_ref.actor)


def _batch():
    torch.manual_seed(0)
    # rows: 0 ends early (EOS at 4), 1 truncated (all L_MAX tokens), 2 ends at 5, 3 truncated
    mask = torch.tensor([[1, 1, 1, 1, 0, 0], [1] * 6, [1, 1, 1, 1, 1, 0], [1] * 6], dtype=torch.bool)
    old = torch.randn(4, L_MAX)
    log_prob = (old + 0.3 * torch.randn(4, L_MAX)).requires_grad_()
    advantages = torch.tensor([1.0, -1.0, -0.5, 2.0]).unsqueeze(-1).expand(4, L_MAX)
    return old, log_prob, advantages, mask


def _call(name, config, old, log_prob, advantages, mask):
    # the exact keyword call of verl.workers.utils.losses.ppo_loss
    return get_policy_loss_fn(name)(
        old_log_prob=old,
        log_prob=log_prob,
        advantages=advantages,
        response_mask=mask,
        loss_agg_mode=config.loss_agg_mode,
        config=config,
        rollout_is_weights=None,
    )


def test_loss_is_registered_through_verls_external_lib_hook(monkeypatch):
    from dapo_suite.train.algorithm import POLICY_LOSSES
    from dapo_suite.train.verl import overlong_filter_loss_name

    import_external_libs(EXTENSION_MODULE)  # what HFModelConfig.__post_init__ does with model.external_lib
    for mode in POLICY_LOSSES:  # DAPO's loss and every successor's, each with overlong filtering
        assert get_policy_loss_fn(overlong_filter_loss_name(mode)).__qualname__.startswith(
            "overlong_filtered"
        )
    assert overlong_filter_loss_name("vanilla") == OVERLONG_FILTER_LOSS


@pytest.mark.parametrize("mode", ["gspo", "cispo", "sapo", "geo_mean", "kl_cov"])
def test_a_successor_with_overlong_filtering_is_verls_loss_on_the_kept_rows(mode, actor_config, monkeypatch):
    from dapo_suite.train.verl import overlong_filter_loss_name

    monkeypatch.setenv("DAPO_SUITE_MAX_RESPONSE_LENGTH", str(L_MAX))
    import_external_libs(EXTENSION_MODULE)
    old, log_prob, advantages, mask = _batch()
    loss, metrics = _call(overlong_filter_loss_name(mode), actor_config, old, log_prob, advantages, mask)
    assert metrics["actor/overlong_filtered_frac"] == 0.5
    kept = mask.clone()
    kept[[1, 3]] = False  # the truncated rows leave the mask (they stay in the batch, as in verl)
    expected, _ = _call(mode, actor_config, old, log_prob.detach(), advantages, kept)
    torch.testing.assert_close(loss.detach(), expected)


def test_truncated_rows_get_no_loss_and_no_gradient(actor_config, monkeypatch):
    monkeypatch.setenv("DAPO_SUITE_MAX_RESPONSE_LENGTH", str(L_MAX))
    import_external_libs(EXTENSION_MODULE)
    old, log_prob, advantages, mask = _batch()
    loss, metrics = _call(OVERLONG_FILTER_LOSS, actor_config, old, log_prob, advantages, mask)
    loss.backward()
    assert actor_config.loss_agg_mode == "token-mean" and actor_config.clip_ratio_high == 0.28
    assert metrics["actor/overlong_filtered_frac"] == 0.5
    assert torch.all(log_prob.grad[1] == 0) and torch.all(log_prob.grad[3] == 0)
    assert log_prob.grad[0, :4].abs().sum() > 0 and log_prob.grad[2, :5].abs().sum() > 0

    # equals verl's vanilla loss on the batch without the truncated rows
    keep = torch.tensor([0, 2])
    expected, _ = compute_policy_loss_vanilla(
        old[keep], log_prob.detach()[keep], advantages[keep], mask[keep], "token-mean", actor_config
    )
    torch.testing.assert_close(loss.detach(), expected)

    # and differs from vanilla on the full batch (the truncated rows did carry loss there)
    vanilla, _ = _call("vanilla", actor_config, old, log_prob.detach(), advantages, mask)
    assert not torch.isclose(vanilla, loss.detach())


def test_all_rows_truncated_gives_zero_loss_not_nan(actor_config, monkeypatch):
    monkeypatch.setenv("DAPO_SUITE_MAX_RESPONSE_LENGTH", str(L_MAX))
    import_external_libs(EXTENSION_MODULE)
    old, log_prob, advantages, _ = _batch()
    loss, metrics = _call(
        OVERLONG_FILTER_LOSS, actor_config, old, log_prob, advantages, torch.ones(4, L_MAX, dtype=torch.bool)
    )
    loss.backward()
    assert loss.item() == 0.0 and metrics["actor/overlong_filtered_frac"] == 1.0
    assert torch.all(log_prob.grad == 0)


def test_missing_l_max_refuses_to_run(actor_config, monkeypatch):
    monkeypatch.delenv("DAPO_SUITE_MAX_RESPONSE_LENGTH", raising=False)
    import_external_libs(EXTENSION_MODULE)
    with pytest.raises(RuntimeError, match="DAPO_SUITE_MAX_RESPONSE_LENGTH"):
        _call(OVERLONG_FILTER_LOSS, actor_config, *_batch())
