"""The DAPO objective: hand-computed branches, invariants, and equivalence with verl 0.9.1's core_algos."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_suite.train.algorithm import (
    LOSS_AGGREGATIONS,
    ScoredGroups,
    entropy_from_logits,
    group_advantages,
    mask_truncated,
    mixed_groups,
    policy_loss,
    soft_overlong_penalty,
    token_log_probs,
    tool_call_shaping,
)
from dapo_suite.train.loss_hyperparameters import LossHyperparameters

verl_core = pytest.importorskip("verl.trainer.ppo.core_algos")


def ragged_batch(seed: int, batch: int = 8, length: int = 12, spread: float = 0.3):
    """Random log-probs with right-padded masks of random lengths (one response may be empty)."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    new = old + spread * torch.randn(batch, length, generator=gen)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    adv = torch.randn(batch, generator=gen).unsqueeze(-1).expand(batch, length).contiguous()
    return new, old, adv, mask


def verl_actor_config(clip_low: float, clip_high: float, clip_c: float | None):
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        clip_ratio_c=clip_c
        if clip_c is not None
        else 1e30,  # verl always dual-clips; "never" is a huge bound
    )


@pytest.mark.parametrize("agg", LOSS_AGGREGATIONS)
@pytest.mark.parametrize("clip", [(0.2, 0.28, None), (0.2, 0.2, 3.0), (0.1, 0.5, 10.0)])
@pytest.mark.parametrize("seed", range(4))
def test_policy_loss_equals_verl_vanilla(agg, clip, seed):
    clip_low, clip_high, clip_c = clip
    new, old, adv, mask = ragged_batch(seed)
    new_ours = new.clone().requires_grad_(True)
    new_verl = new.clone().requires_grad_(True)

    ours, metrics = policy_loss(
        new_ours,
        old,
        adv,
        mask,
        LossHyperparameters(clip_low=clip_low, clip_high=clip_high, clip_c=clip_c, loss_agg=agg),
    )
    theirs, verl_metrics = verl_core.compute_policy_loss_vanilla(
        old, new_verl, adv, mask, loss_agg_mode=agg, config=verl_actor_config(clip_low, clip_high, clip_c)
    )
    ours.backward()
    theirs.backward()

    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    torch.testing.assert_close(new_ours.grad, new_verl.grad, atol=1e-6, rtol=0)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(verl_metrics["actor/pg_clipfrac"], abs=1e-6)
    assert metrics["actor/ppo_kl"] == pytest.approx(verl_metrics["actor/ppo_kl"], abs=1e-6)
    # verl's "pg_clipfrac_lower" counts dual-clipped tokens.
    assert metrics["actor/dual_clipfrac"] == pytest.approx(verl_metrics["actor/pg_clipfrac_lower"], abs=1e-6)


def test_token_mean_over_micro_batches_equals_full_batch_loss():
    # Gradient accumulation: each micro-batch divides by the mini-batch's token count (not its own).
    new, old, adv, mask = ragged_batch(7, batch=12)
    full_new = new.clone().requires_grad_(True)
    full, _ = policy_loss(full_new, old, adv, mask)
    full.backward()

    acc_new = new.clone().requires_grad_(True)
    total_tokens = mask.sum()
    accumulated = 0.0
    for rows in torch.split(torch.arange(12), 4):
        micro, _ = policy_loss(
            acc_new[rows], old[rows], adv[rows], mask[rows], num_global_tokens=total_tokens
        )
        micro.backward()
        accumulated += micro.item()
    assert accumulated == pytest.approx(full.item(), abs=1e-6)
    torch.testing.assert_close(acc_new.grad, full_new.grad, atol=1e-7, rtol=0)


def test_micro_batch_token_mean_matches_verl_global_batch_info():
    from verl.workers.config import ActorConfig

    new, old, adv, mask = ragged_batch(3)
    config = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio_c=1e30)
    config.global_batch_info["batch_num_tokens"] = 1000
    theirs, _ = verl_core.compute_policy_loss_vanilla(
        old, new, adv, mask, loss_agg_mode="token-mean", config=config
    )
    ours, _ = policy_loss(
        new, old, adv, mask, LossHyperparameters(clip_low=0.2, clip_high=0.2), num_global_tokens=1000
    )
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-7)


def test_clip_higher_hand_computed():
    # One token each: ratio 1.5 with A=+1 is clipped at 1+0.28; ratio 0.5 with A=-1 is clipped at 1-0.2.
    old = torch.zeros(2, 1)
    new = torch.log(torch.tensor([[1.5], [0.5]]))
    adv = torch.tensor([1.0, -1.0])
    mask = torch.ones(2, 1)
    loss, metrics = policy_loss(new, old, adv, mask, LossHyperparameters(clip_low=0.2, clip_high=0.28))
    # token losses: -min(1.5*1, 1.28*1) = -1.28 ; -min(0.5*-1, 0.8*-1) = 0.8
    assert loss.item() == pytest.approx((-1.28 + 0.8) / 2)
    assert metrics["actor/clipfrac_upper"] == pytest.approx(0.5)
    assert metrics["actor/clipfrac_lower"] == pytest.approx(0.5)
    assert metrics["actor/ratio_max"] == pytest.approx(1.5)


def test_equal_clip_bounds_is_ppo_clip():
    new, old, adv, mask = ragged_batch(11)
    ratio = torch.exp(new - old)
    ppo = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))
    expected = (ppo * mask).sum() / mask.sum()
    loss, _ = policy_loss(new, old, adv, mask, LossHyperparameters(clip_low=0.2, clip_high=0.2))
    assert loss.item() == pytest.approx(expected.item(), abs=1e-6)


def test_dual_clip_bounds_negative_advantage_loss():
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[20.0]]))  # ratio 20 on a bad token: PPO loss 20, dual-clip caps it at c=3
    loss, metrics = policy_loss(
        new, old, torch.tensor([-1.0]), torch.ones(1, 1), LossHyperparameters(clip_c=3.0)
    )
    assert loss.item() == pytest.approx(3.0)
    assert metrics["actor/dual_clipfrac"] == 1.0
    with pytest.raises(ValueError, match="clip_c"):
        policy_loss(new, old, torch.tensor([-1.0]), torch.ones(1, 1), LossHyperparameters(clip_c=1.0))


def test_unknown_aggregation_names_the_valid_ones():
    new, old, adv, mask = ragged_batch(0)
    with pytest.raises(ValueError, match="token-mean"):
        policy_loss(new, old, adv, mask, LossHyperparameters(loss_agg="sample-mean"))


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), agg=st.sampled_from(LOSS_AGGREGATIONS))
def test_zero_advantage_gives_zero_loss_and_gradient(seed, agg):
    new, old, _, mask = ragged_batch(seed)
    new = new.requires_grad_(True)
    loss, _ = policy_loss(
        new, old, torch.zeros(new.shape[0]), mask, LossHyperparameters(loss_agg=agg, clip_c=3.0)
    )
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(new.grad) == 0


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), spread=st.floats(0.01, 2.0))
def test_clipping_never_increases_the_objective(seed, spread):
    # The clipped surrogate is a pessimistic bound: its loss is never below the unclipped policy-gradient
    # loss. Dual-clip (clip_c) is the exception by design, it caps the loss of A < 0 tokens: off here.
    new, old, adv, mask = ragged_batch(seed, spread=spread)
    clipped, _ = policy_loss(new, old, adv, mask, LossHyperparameters(clip_c=None))
    unclipped = (-adv * torch.exp(new - old) * mask).sum() / mask.sum()
    assert clipped.item() >= unclipped.item() - 1e-6


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_token_mean_weights_every_token_equally(seed):
    # With ratio 1 (on-policy) the gradient w.r.t. each token's log-prob is -A / total_tokens, whatever the
    # length of its response; seq-mean-token-mean instead gives long responses' tokens less weight.
    _, old, adv, mask = ragged_batch(seed)
    new = old.clone().requires_grad_(True)
    loss, _ = policy_loss(new, old, adv, mask)
    loss.backward()
    expected = -adv * mask / mask.sum()
    torch.testing.assert_close(new.grad, expected, atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("norm", ["group", "none"])
def test_group_advantages_equal_verl_grpo(seed, norm):
    rng = np.random.default_rng(seed)
    group_ids = np.array([f"q{i}" for i in rng.integers(0, 5, size=20)], dtype=object)
    group_ids[0] = "singleton"  # a group of one: verl gives mean 0, std 1
    scores = torch.tensor(rng.choice([-1.0, 1.0, 0.5], size=20), dtype=torch.float32)
    mask = torch.ones(20, 3)
    token_rewards = torch.zeros(20, 3)
    token_rewards[:, -1] = scores
    theirs, _ = verl_core.compute_grpo_outcome_advantage(
        token_rewards, mask, group_ids, epsilon=1e-6, norm_adv_by_std_in_grpo=norm == "group"
    )
    ours = group_advantages(ScoredGroups.of(scores, list(group_ids)), norm=norm, eps=1e-6)
    torch.testing.assert_close(ours, theirs[:, 0], atol=1e-6, rtol=0)


def test_group_advantages_hand_computed():
    scores = torch.tensor([1.0, -1.0, -1.0, -1.0, 1.0, 1.0])
    adv = group_advantages(ScoredGroups.of(scores, [0, 0, 0, 0, 1, 1]))
    std = math.sqrt(((1.5**2) + 3 * (0.5**2)) / 3)  # unbiased std of [1,-1,-1,-1] (mean -0.5)
    assert adv[0].item() == pytest.approx(1.5 / std, rel=1e-5)
    assert adv[1].item() == pytest.approx(-0.5 / std, rel=1e-5)
    assert adv[4].item() == 0.0 and adv[5].item() == 0.0  # constant-reward group: zero advantage


def test_overlong_penalty_each_branch():
    lengths = torch.tensor([0, 16, 17, 18, 20, 24, 25, 100])
    penalty = soft_overlong_penalty(lengths, max_len=24, buffer_len=8)
    expected = [0.0, 0.0, -1 / 8, -2 / 8, -4 / 8, -1.0, -1.0, -1.0]
    assert penalty.tolist() == pytest.approx(expected)
    assert soft_overlong_penalty(torch.tensor([20]), 24, 8, factor=0.5).item() == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="buffer_len"):
        soft_overlong_penalty(lengths, max_len=4, buffer_len=8)


def test_overlong_penalty_matches_verl_dapo_reward_manager_formula():
    # verl's DAPO reward manager: min(-(len - (max - buffer)) / buffer * factor, 0) for len <= max.
    max_len, buffer_len, factor = 20480, 4096, 1.0
    lengths = torch.arange(0, max_len + 1, 97)
    expected = torch.clamp(-(lengths - (max_len - buffer_len)) / buffer_len * factor, max=0.0)
    torch.testing.assert_close(soft_overlong_penalty(lengths, max_len, buffer_len, factor), expected.float())


def test_tool_call_shaping_is_retool_s_bonus_for_a_wrong_answer_capped():
    # ReTool's recipe: a wrong answer scores min(-0.6, -1 + 0.1 (num_turns - 2) / 2), k calls making 2k + 2
    # turns; a right one is unchanged
    scores = torch.tensor([1.0, -1.0, -1.0, -1.0, -1.0, 1.0])
    correct = torch.tensor([True, False, False, False, False, True])
    calls = torch.tensor([3, 0, 1, 3, 7, 0])
    shaped = tool_call_shaping(scores, correct, calls, bonus=0.1, cap=-0.6)
    recipe = [
        s if c else min(-0.6, s + 0.1 * ((2 * k + 2) - 2) / 2)
        for s, c, k in zip(scores.tolist(), correct.tolist(), calls.tolist(), strict=True)
    ]
    assert shaped.tolist() == pytest.approx(recipe)
    assert shaped.tolist() == pytest.approx([1.0, -1.0, -0.9, -0.7, -0.6, 1.0])


def test_mixed_groups_keeps_only_groups_with_both_outcomes():
    acc = torch.tensor([1, 1, 1, 0, 0, 0, 1, 0, 0])
    keep = mixed_groups(acc, ["a", "a", "a", "b", "b", "b", "c", "c", "c"])
    assert keep.tolist() == [False] * 6 + [True] * 3


def test_mask_truncated_zeroes_truncated_rows_only():
    mask = torch.ones(3, 4)
    out = mask_truncated(mask, torch.tensor([False, True, False]))
    assert out.tolist() == [[1] * 4, [0] * 4, [1] * 4]
    new, old, adv, _ = ragged_batch(1, batch=3, length=4)
    loss, _ = policy_loss(new, old, adv, out)
    loss_without_row, _ = policy_loss(new[[0, 2]], old[[0, 2]], adv[[0, 2]], mask[[0, 2]])
    assert loss.item() == pytest.approx(loss_without_row.item(), abs=1e-7)


def test_entropy_and_log_probs_match_verl():
    from verl.utils.torch_functional import entropy_from_logits as verl_entropy
    from verl.utils.torch_functional import logprobs_from_logits as verl_logprobs

    logits = torch.randn(3, 5, 50, generator=torch.Generator().manual_seed(0)) * 3
    tokens = torch.randint(0, 50, (3, 5), generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(entropy_from_logits(logits), verl_entropy(logits), atol=1e-5, rtol=0)
    torch.testing.assert_close(
        token_log_probs(logits, tokens), verl_logprobs(logits, tokens), atol=1e-5, rtol=0
    )
    uniform = entropy_from_logits(torch.zeros(1, 1, 50))
    assert uniform.item() == pytest.approx(math.log(50), rel=1e-6)
