"""DAPO's successors (GSPO, CISPO, SAPO, GMPO, Clip-Cov, KL-Cov) against verl 0.9.1's registered losses, on
random ragged batches, loss and gradient, for every aggregation each mode is defined for; hand-computed
branches."""

from __future__ import annotations

import inspect
import math

import pytest
import torch

from dapo_suite.train.algorithm import (
    LOSS_AGGREGATIONS,
    POLICY_LOSSES,
    policy_loss,
)
from dapo_suite.train.loss_hyperparameters import LossHyperparameters

verl_core = pytest.importorskip("verl.trainer.ppo.core_algos")

SUCCESSORS = ("gspo", "cispo", "sapo", "geo_mean", "clip_cov", "kl_cov")
# Knobs wide enough that every branch acts on a 10 x 14 batch (clip bounds bind, covariance windows select
# tokens).
HYPER = {
    "clip_low": 0.15,
    "clip_high": 0.25,
    "clip_cov_ratio": 0.05,
    "clip_cov_lb": 0.3,
    "clip_cov_ub": 2.0,
    "kl_cov_ratio": 0.05,
    "ppo_kl_coef": 0.7,
    "tau_pos": 1.3,
    "tau_neg": 2.1,
}


def ragged(seed: int, batch: int = 10, length: int = 14, token_advantages: bool = False):
    """Random log-probs, right-padded masks of random lengths (some empty), advantages per row or per
    token."""
    gen = torch.Generator().manual_seed(seed)
    old = -torch.rand(batch, length, generator=gen) * 3
    new = old + 0.4 * torch.randn(batch, length, generator=gen)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = length
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    shape = (batch, length) if token_advantages else (batch, 1)
    adv = (torch.randn(*shape, generator=gen) * 1.5).expand(batch, length).contiguous()
    return new, old, adv, mask


def verl_config(**global_batch_info):
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    config = ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=HYPER["clip_low"],
        clip_ratio_high=HYPER["clip_high"],
        tau_pos=HYPER["tau_pos"],
        tau_neg=HYPER["tau_neg"],
        policy_loss=PolicyLossConfig(
            clip_cov_ratio=HYPER["clip_cov_ratio"],
            clip_cov_lb=HYPER["clip_cov_lb"],
            clip_cov_ub=HYPER["clip_cov_ub"],
            kl_cov_ratio=HYPER["kl_cov_ratio"],
            ppo_kl_coef=HYPER["ppo_kl_coef"],
        ),
    )
    config.global_batch_info.update(global_batch_info)
    return config


def both(mode: str, agg: str, new, old, adv, mask, weights=None, ours_extra=None, verl_extra=None, seed=0):
    """(our loss, our grad, verl's loss, verl's grad), each side starting from the same torch seed."""
    results = []
    for side in ("ours", "verl"):
        log_prob = new.clone().requires_grad_(True)
        torch.manual_seed(seed)  # Clip-Cov draws its dropped tokens from torch's global generator
        if side == "ours":
            loss, _ = policy_loss(
                log_prob,
                old,
                adv,
                mask,
                LossHyperparameters(loss_mode=mode, loss_agg=agg, **HYPER),
                rollout_is_weights=weights,
                **(ours_extra or {}),
            )
        else:
            loss, _ = verl_core.get_policy_loss_fn(mode)(
                old,
                log_prob,
                adv,
                mask,
                loss_agg_mode=agg,
                config=verl_config(**(verl_extra or {})),
                rollout_is_weights=weights,
            )
        loss.backward()
        results += [loss.detach(), log_prob.grad]
    return results


CASES = [(mode, agg) for mode in SUCCESSORS for agg in POLICY_LOSSES[mode].aggregations]


@pytest.mark.parametrize(("mode", "agg"), CASES)
@pytest.mark.parametrize("seed", range(6))
def test_each_successor_equals_verl_in_loss_and_gradient(mode, agg, seed):
    new, old, adv, mask = ragged(seed, token_advantages=seed % 2 == 1)
    ours, our_grad, theirs, their_grad = both(mode, agg, new, old, adv, mask, seed=seed)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    torch.testing.assert_close(our_grad, their_grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode", SUCCESSORS)
@pytest.mark.parametrize("seed", range(3))
def test_rollout_correction_weights_enter_each_loss_as_in_verl(mode, seed):
    new, old, adv, mask = ragged(seed + 100)
    weights = torch.rand(new.shape, generator=torch.Generator().manual_seed(seed)) * 2 * mask
    agg = POLICY_LOSSES[mode].aggregations[0]
    ours, our_grad, theirs, their_grad = both(mode, agg, new, old, adv, mask, weights=weights, seed=seed)
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-6)
    torch.testing.assert_close(our_grad, their_grad, atol=1e-6, rtol=0)


MICRO_CASES = [
    (mode, agg)
    for mode, agg in CASES
    if not POLICY_LOSSES[mode].per_sequence
    and agg in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
]


@pytest.mark.parametrize(("mode", "agg"), MICRO_CASES)
def test_micro_batch_denominators_equal_verl_global_batch_info(mode, agg):
    new, old, adv, mask = ragged(7)
    ours, our_grad, theirs, their_grad = both(
        mode,
        agg,
        new,
        old,
        adv,
        mask,
        ours_extra={"num_global_tokens": 500, "num_global_sequences": 40, "seq_sum_norm": 64},
        verl_extra={"batch_num_tokens": 500, "global_batch_size": 40, "loss_scale_factor": 64},
    )
    assert ours.item() == pytest.approx(theirs.item(), abs=1e-7)
    torch.testing.assert_close(our_grad, their_grad, atol=1e-7, rtol=0)


def test_the_equivalence_cases_exercise_every_branch():
    # Guards the test above against passing vacuously: with these knobs each mode's special branch acts.
    new, old, adv, mask = ragged(0)
    metrics = {
        mode: policy_loss(
            new,
            old,
            adv,
            mask,
            LossHyperparameters(loss_mode=mode, loss_agg=POLICY_LOSSES[mode].aggregations[0], **HYPER),
        )[1]
        for mode in SUCCESSORS
    }
    for mode in ("gspo", "cispo", "geo_mean", "clip_cov", "kl_cov"):
        assert metrics[mode]["actor/pg_clipfrac"] > 0, mode


def test_clip_cov_is_random_and_the_seed_fixes_it():
    new, old, adv, mask = ragged(3)

    def dropped(seed: int) -> float:
        torch.manual_seed(seed)
        return policy_loss(new, old, adv, mask, LossHyperparameters(loss_mode="clip_cov", **HYPER))[0].item()

    draws = {round(dropped(seed), 9) for seed in range(12)}
    assert dropped(5) == dropped(5)
    assert len(draws) > 1  # which tokens lose their gradient depends on the draw


def test_every_mode_has_the_shared_signature_and_a_paper():
    reference = list(inspect.signature(POLICY_LOSSES["vanilla"].fn).parameters)
    for name, mode in POLICY_LOSSES.items():
        assert list(inspect.signature(mode.fn).parameters) == reference, name
        assert mode.paper and set(mode.aggregations) <= set(LOSS_AGGREGATIONS), name
        assert name in verl_core.POLICY_LOSS_REGISTRY, f"{name} is not a verl 0.9.1 loss_mode"


def test_unknown_mode_and_unsupported_aggregation_say_what_is_valid():
    new, old, adv, mask = ragged(0)
    with pytest.raises(ValueError, match="valid: vanilla, gspo, cispo, sapo, geo_mean, clip_cov, kl_cov"):
        policy_loss(new, old, adv, mask, LossHyperparameters(loss_mode="gpro"))
    with pytest.raises(ValueError, match="'sapo' aggregates only as seq-mean-token-mean"):
        policy_loss(new, old, adv, mask, LossHyperparameters(loss_mode="sapo", loss_agg="token-mean"))


def test_gspo_hand_computed_one_ratio_per_sequence():
    # Two tokens with log-ratios +0.2 and -0.1: s = exp(0.05) for both; A = 1, clip at 1 +- 0.02 binds above.
    old = torch.zeros(1, 2)
    new = torch.tensor([[0.2, -0.1]])
    loss, _ = policy_loss(
        new,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        LossHyperparameters(loss_mode="gspo", clip_low=0.02, clip_high=0.02),
    )
    assert loss.item() == pytest.approx(-1.02)
    loss, _ = policy_loss(
        new,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 2),
        LossHyperparameters(loss_mode="gspo", clip_low=0.2, clip_high=0.2),
    )
    assert loss.item() == pytest.approx(-math.exp(0.05), rel=1e-6)


def test_cispo_keeps_the_gradient_of_clipped_tokens():
    # r = 2 with A = +1 is far above 1 + eps_high: PPO-clip gives no gradient, CISPO gives -clip(r) * A.
    old = torch.zeros(1, 1)
    new = torch.log(torch.tensor([[2.0]])).requires_grad_(True)
    loss, _ = policy_loss(
        new,
        old,
        torch.tensor([1.0]),
        torch.ones(1, 1),
        LossHyperparameters(loss_mode="cispo", clip_high=0.28),
    )
    loss.backward()
    assert new.grad.item() == pytest.approx(-1.28)
    ppo = new.detach().clone().requires_grad_(True)
    policy_loss(ppo, old, torch.tensor([1.0]), torch.ones(1, 1), LossHyperparameters(clip_high=0.28))[
        0
    ].backward()
    assert ppo.grad.item() == 0.0


def test_sapo_gate_is_the_policy_gradient_on_policy_and_fades_off_policy():
    # d/dlog r of -f(r) A at r = 1 is -A (like the unclipped surrogate); far off-policy it tends to 0.
    for log_ratio, expected in ((0.0, -1.0), (3.0, 0.0)):
        new = torch.tensor([[log_ratio]], requires_grad=True)
        loss, _ = policy_loss(
            new,
            torch.zeros(1, 1),
            torch.tensor([1.0]),
            torch.ones(1, 1),
            LossHyperparameters(loss_mode="sapo", loss_agg="seq-mean-token-mean", tau_pos=1.0),
        )
        loss.backward()
        assert new.grad.item() == pytest.approx(expected, abs=0.02)


def test_geo_mean_is_the_geometric_mean_of_clipped_token_ratios():
    new = torch.tensor([[0.1, 0.9, -0.3]])  # 0.9 clipped to 0.4 for A > 0
    loss, metrics = policy_loss(
        new,
        torch.zeros(1, 3),
        torch.tensor([2.0]),
        torch.ones(1, 3),
        LossHyperparameters(
            loss_mode="geo_mean", loss_agg="seq-mean-token-mean", clip_low=0.4, clip_high=0.4
        ),
    )
    assert loss.item() == pytest.approx(-2.0 * math.exp((0.1 + 0.4 - 0.3) / 3), rel=1e-6)
    assert metrics["actor/clipfrac_upper"] == pytest.approx(1 / 3)


def test_kl_cov_penalises_the_top_covariance_tokens_only():
    # 10 tokens, k = 1: only the token with the largest (A - mean A)(log p - mean log p) gets beta |log r|.
    new = torch.tensor([[-0.1] * 5 + [-3.0] * 5])
    old = new + 0.5
    adv = torch.tensor([[1.0] * 5 + [-1.0] * 5])
    new[0, 5] = -4.0  # the most negative log-prob among negative advantages: the largest covariance
    loss, metrics = policy_loss(
        new,
        old,
        adv,
        torch.ones(1, 10),
        LossHyperparameters(loss_mode="kl_cov", kl_cov_ratio=0.1, ppo_kl_coef=2.0),
    )
    plain = (-adv * torch.exp(new - old)).mean()
    assert loss.item() == pytest.approx(plain.item() + 2.0 * abs((new - old)[0, 5].item()) / 10, rel=1e-6)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(0.1)


def test_hyperparameter_names_are_verls():
    from verl.workers.config import ActorConfig
    from verl.workers.config.actor import PolicyLossConfig

    verl_names = {f for f in PolicyLossConfig.__dataclass_fields__} | {
        f for f in ActorConfig.__dataclass_fields__
    }
    renamed = {
        "clip_low": "clip_ratio_low",
        "clip_high": "clip_ratio_high",
        "clip_c": "clip_ratio_c",
        "loss_agg": "loss_agg_mode",
    }
    ours = {renamed.get(name, name) for name in LossHyperparameters.__dataclass_fields__}
    assert ours <= verl_names


# ---- advantage estimators
# -------------------------------------------------------------------------------------


def outcome_batch(seed: int, size: int = 24, length: int = 9):
    """Rewards of random groups (one singleton for the estimators that allow it), with random response
    lengths."""
    gen = torch.Generator().manual_seed(seed)
    group_ids = [f"q{i % 5}" for i in torch.randperm(size, generator=gen).tolist()]  # groups of 4 or 5
    scores = torch.randn(size, generator=gen).round(decimals=1)  # shaped rewards; ties happen, not everywhere
    lengths = torch.randint(1, length + 1, (size,), generator=gen)
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    token_rewards = torch.zeros(size, length)
    # verl puts the outcome on the last response token
    token_rewards[torch.arange(size), lengths - 1] = scores
    return scores, group_ids, lengths, mask, token_rewards


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize(
    ("name", "norm", "verl_fn"),
    [
        ("rloo", "none", "compute_rloo_outcome_advantage"),
        ("reinforce_plus_plus_baseline", "batch", "compute_reinforce_plus_plus_baseline_outcome_advantage"),
        ("grpo_passk", "group", "compute_grpo_passk_outcome_advantage"),
        ("grpo_passk", "none", "compute_grpo_passk_outcome_advantage"),
    ],
)
def test_advantage_estimators_equal_verl(seed, name, norm, verl_fn):
    import numpy as np
    from verl.trainer.config import AlgoConfig

    from dapo_suite.train.algorithm import compute_advantages

    scores, group_ids, lengths, mask, token_rewards = outcome_batch(seed)
    if name != "grpo_passk":
        group_ids[0] = "singleton"  # verl: a group of one keeps its reward (RLOO) / has mean 0 (RF++)
    theirs, _ = getattr(verl_core, verl_fn)(
        token_rewards,
        mask,
        np.array(group_ids, dtype=object),
        epsilon=1e-6,
        config=AlgoConfig(norm_adv_by_std_in_grpo=norm == "group"),
    )
    ours = compute_advantages(name, scores, group_ids, lengths, norm=norm)
    torch.testing.assert_close(ours.unsqueeze(-1) * mask, theirs, atol=1e-6, rtol=0)
    assert theirs.abs().sum() > 0


def test_rloo_is_the_leave_one_out_baseline_by_hand():
    from dapo_suite.train.algorithm import compute_advantages

    adv = compute_advantages("rloo", torch.tensor([1.0, -1.0, -1.0]), [0, 0, 0], torch.ones(3))
    assert adv.tolist() == pytest.approx([1 - (-1), -1 - 0, -1 - 0])  # R_i - mean of the other two


def test_batch_std_divides_every_group_by_the_batch_std():
    from dapo_suite.train.algorithm import compute_advantages

    scores = torch.tensor([1.0, -1.0, 1.0, 1.0, 1.0, -1.0])
    groups = [0, 0, 1, 1, 1, 1]
    adv = compute_advantages("grpo", scores, groups, torch.ones(6), norm="batch")
    batch_std = scores.std().item()  # unbiased, over all 6 rewards
    assert adv.tolist() == pytest.approx(
        [1 / batch_std, -1 / batch_std, 0.5 / batch_std, 0.5 / batch_std, 0.5 / batch_std, -1.5 / batch_std],
        rel=1e-5,
    )
    group_adv = compute_advantages("grpo", scores, groups, torch.ones(6))
    assert group_adv[0].item() != pytest.approx(adv[0].item())  # a different scale than the group std


def test_passk_credits_only_the_best_of_each_group():
    from dapo_suite.train.algorithm import compute_advantages

    adv = compute_advantages(
        "grpo_passk", torch.tensor([0.2, 1.0, -1.0, 1.0, 1.0]), [0, 0, 0, 1, 1], torch.ones(5), norm="none"
    )
    assert adv.tolist() == pytest.approx([0.0, 0.8, 0.0, 0.0, 0.0])  # group 1: a tie for the best gives 0


def test_unknown_estimator_and_normalisation_say_what_is_valid():
    from dapo_suite.train.algorithm import compute_advantages

    with pytest.raises(ValueError, match="valid: grpo, rloo, reinforce_plus_plus_baseline, grpo_passk"):
        compute_advantages("ppo", torch.ones(2), [0, 0], torch.ones(2))
    with pytest.raises(ValueError, match="'rloo' normalises only as none"):
        compute_advantages("rloo", torch.ones(2), [0, 0], torch.ones(2), norm="group")


# ---- rollout correction
# ---------------------------------------------------------------------------------------

rollout_corr = pytest.importorskip("verl.trainer.ppo.rollout_corr_helper")


def mismatch(seed: int, batch: int = 12, length: int = 16, spread: float = 0.25):
    """Trainer and sampler log-probs that differ by a random amount per token; ragged masks, one row empty."""
    gen = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(batch, length, generator=gen) * 3
    old = rollout + spread * torch.randn(batch, length, generator=gen)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0], lengths[1] = length, 0
    mask = (torch.arange(length)[None, :] < lengths[:, None]).float()
    return old, rollout, mask


IS_CASES = [
    ("token", 1.3),
    ("token", "0.8_1.25"),
    ("token", "1.1"),
    ("sequence", 1.5),
    ("sequence", "0.7_1.4"),
]


@pytest.mark.parametrize(("level", "threshold"), IS_CASES)
@pytest.mark.parametrize("batch_normalize", [False, True])
@pytest.mark.parametrize("seed", range(4))
def test_correction_weights_equal_verl(level, threshold, batch_normalize, seed):
    from dapo_suite.train.rollout_correction import correction_weights

    old, rollout, mask = mismatch(seed)
    ours, metrics = correction_weights(old - rollout, mask, level, threshold, batch_normalize)
    theirs, verl_metrics = rollout_corr.compute_rollout_correction_weights(
        old - rollout, mask, level, threshold, batch_normalize
    )
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    assert 0 < metrics["rollout_corr/is_clipped_frac"] < 1  # the bound acts on some tokens, not all
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx(verl_metrics["rollout_is_mean"], rel=1e-5)


RS_CASES = [
    ("token_k1", "0.8_1.25"),
    ("token_k1", 1.2),
    ("token_k2", 0.02),
    ("token_k3", 0.02),
    ("seq_sum_k1", "0.4_2.5"),
    ("seq_sum_k2", 0.3),
    ("seq_sum_k3", 0.3),
    ("seq_mean_k1", "0.95_1.05"),
    ("seq_mean_k2", 0.03),
    ("seq_mean_k3", 0.03),
    ("seq_max_k2", 0.1),
    ("seq_max_k3", 0.1),
    ("token_k1,seq_mean_k3", "0.7_1.4,0.03"),
    ("seq_sum_k2,seq_max_k3,token_k2", 0.1),
]


@pytest.mark.parametrize(("criteria", "threshold"), RS_CASES)
@pytest.mark.parametrize("seed", range(4))
def test_rejection_mask_equals_verl(criteria, threshold, seed):
    from dapo_suite.train.rollout_correction import rejection_mask

    old, rollout, mask = mismatch(seed)
    ours, metrics = rejection_mask(old - rollout, mask, criteria, threshold)
    theirs, _ = rollout_corr.compute_rollout_rejection_mask(old - rollout, mask, criteria, threshold)
    assert torch.equal(ours, theirs)
    assert 0 < metrics["rollout_corr/rejected_frac"] < 1


def test_every_rejection_criterion_is_one_of_verls():
    from dapo_suite.train.rollout_correction import REJECTION_CRITERIA

    assert set(REJECTION_CRITERIA) == rollout_corr.SUPPORTED_ROLLOUT_RS_OPTIONS


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda rc, lr, m: rc.rejection_mask(lr, m, "seq_max_k1", 2.0), "valid criteria are token_k1"),
        (lambda rc, lr, m: rc.rejection_mask(lr, m, "token_k2", "0.5_2"), "takes one upper bound"),
        (lambda rc, lr, m: rc.rejection_mask(lr, m, "token_k2,token_k3", "1,2,3"), "one per criterion"),
        (lambda rc, lr, m: rc.rejection_mask(lr, m, "token_k2", None), "rollout_rs_threshold is required"),
        (lambda rc, lr, m: rc.correction_weights(lr, m, "sequence", "5_0.5"), "lower <= upper"),
        (lambda rc, lr, m: rc.correction_weights(lr, m, "sentence", 2.0), "token, sequence"),
    ],
)
def test_bad_correction_settings_say_what_to_write(call, message):
    from dapo_suite.train import rollout_correction

    old, rollout, mask = mismatch(0)
    with pytest.raises(ValueError, match=message):
        call(rollout_correction, old - rollout, mask)


def test_no_mismatch_means_no_correction():
    from dapo_suite.train.rollout_correction import rollout_correction

    _, rollout, mask = mismatch(1)
    weights, kept, metrics = rollout_correction(
        rollout, rollout, mask, "sequence", "0.5_2.0", rollout_rs="seq_mean_k3", rollout_rs_threshold=1e-4
    )
    assert torch.equal(weights, mask) and torch.equal(kept, mask)
    assert metrics["rollout_corr/masked_frac"] == 0 and metrics["rollout_corr/kl"] == 0


# ---- the embedded trainer
# -------------------------------------------------------------------------------------


TINY = {
    "heldout_size": 2,
    "group_size": 3,
    "gen_batch_size": 2,
    "train_batch_size": 2,
    "mini_batch_size": 1,
    "micro_batch_size": 3,
    "max_response_length": 8,
    "overlong_buffer_len": 4,
    "dynamic_sampling": False,
    "overlong_filter": False,
    "lr": 1e-4,
    "warmup_steps": 0,
}


# Sampling and training in float32 on every CPU (tiny-cpu's `auto` picks bf16 where it is native); a test that
# wants bf16 asks for it.
FLOAT32 = {"sampling_dtype": None, "autocast_dtype": None}


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    """One embedded trainer for this module (loading the model is most of a one-step run's time): every group
    trains (no dynamic sampling) and no response is masked for its length, so the loss path always runs."""
    from dapo_suite.train.config import resolve_config
    from dapo_suite.train.trainer import DAPOTrainer

    return DAPOTrainer(
        resolve_config(["dapo"], {"out": str(tmp_path_factory.mktemp("run")), **TINY}, FLOAT32)
    )


def configure(trainer, presets, **overrides):
    """Point the shared trainer at another resolved config: the trainer and its actor read the objective from
    it at every step. The sampler gets the weights as they are, as after a step: a test before may have
    updated them without a step's sync."""
    from dapo_suite.train.config import resolve_config

    trainer.config = trainer.actor.config = resolve_config(
        presets, {"out": trainer.config.out, **TINY}, {**FLOAT32, **overrides}
    )
    trainer.engine.sync_weights()
    return trainer


@pytest.mark.slow  # ~10 s each on a quiet 2-core machine, minutes when it is shared
@pytest.mark.parametrize("preset", ["gspo", "cispo", "sapo", "gmpo", "clip-cov", "kl-cov"])
def test_each_successor_preset_trains_one_step(preset, trainer):
    from dapo_suite.train.config import SUCCESSORS

    assert preset in SUCCESSORS
    configure(trainer, [preset])
    assert trainer.config.loss_mode != "vanilla"
    groups, _ = trainer.collect()
    # Eight tokens of a 135M model rarely earn a reward: advantages of +-1 give every mini-batch a gradient,
    # so the guard against zero-gradient steps does not hide the objective.
    for group in groups:
        for index, r in enumerate(group):
            r.advantage = 1.0 if index % 2 == 0 else -1.0
    metrics = trainer.actor.update(groups)
    assert metrics["actor/updates"] == 2 and metrics["actor/updates_skipped"] == 0
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/grad_norm"] > 0
    assert not any(key.startswith("rollout_corr/") for key in metrics)  # same dtype, same engine: auto is off


def test_rollout_correction_on_reweights_with_the_samplers_log_probs(trainer):
    configure(
        trainer,
        ["dapo"],
        rollout_correction="on",
        rollout_is="token",
        rollout_is_threshold="1.5",
        rollout_rs="token_k1",
        rollout_rs_threshold="0.9_1.1",
    )
    groups, _ = trainer.collect()
    rollouts = [r for group in groups for r in group]
    # The trainer recomputed pi_old and kept the sampler's: the same fp32 model, so they agree closely.
    assert all(r.rollout_log_prob is not None for r in rollouts)
    for r in rollouts:
        torch.testing.assert_close(r.old_log_prob, r.rollout_log_prob, atol=2e-4, rtol=0)
    # A sampler that was off by +-0.5 nats on alternate tokens: weights truncate at 1.5, rejection drops them.
    for r in rollouts:
        r.rollout_log_prob = r.old_log_prob + 0.5 * (torch.arange(r.length) % 2 * 2 - 1)
    correction, metrics = trainer.actor.correction(rollouts)
    weights, kept = correction[id(rollouts[0])]
    assert weights[1].item() == pytest.approx(math.exp(-0.5), rel=1e-4)  # pi_old / pi_rollout = e^-0.5
    assert weights[0].item() == pytest.approx(1.5)  # e^0.5 truncated at C = 1.5
    assert kept.sum().item() == 0  # |log rho| = 0.5 leaves the ratio band (0.9, 1.1) everywhere
    assert metrics["rollout_corr/masked_frac"] == 1.0 and metrics["rollout_corr/kl"] == pytest.approx(
        0, abs=0.1
    )
    assert trainer.actor.update(groups)["actor/updates"] == 0  # every token rejected: nothing to train on


def test_rollout_correction_metrics_are_logged_in_a_step(trainer):
    configure(trainer, ["dapo"], rollout_correction="on")
    metrics = trainer.step()
    assert metrics["rollout_corr/is_weight_mean"] == pytest.approx(1.0, abs=1e-3)
    assert metrics["rollout_corr/is_weight_max"] < 1.01 and metrics["rollout_corr/masked_frac"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize(
    ("estimator", "norm"),
    [("rloo", None), ("reinforce_plus_plus_baseline", None), ("grpo_passk", None), ("grpo", "batch")],
)
def test_other_advantage_estimators_train_one_step(estimator, norm, trainer):
    from dapo_suite.train.algorithm import compute_advantages

    configure(trainer, ["dapo"], adv_estimator=estimator, adv_norm=norm)
    groups, _ = trainer.collect()
    rollouts = [r for group in groups for r in group]
    expected = compute_advantages(
        estimator,
        torch.tensor([r.reward for r in rollouts]),
        [g for g, group in enumerate(groups) for _ in group],
        torch.tensor([r.length for r in rollouts]),
        norm,
    )
    assert [r.advantage for r in rollouts] == pytest.approx(expected.tolist())
    # One group per mini-batch: a group whose advantages are all zero gives no gradient, and no step.
    learning = sum(any(r.advantage for r in group) for group in groups)
    metrics = trainer.actor.update(groups)
    assert (metrics["actor/updates"], metrics["actor/updates_skipped"]) == (learning, 2 - learning)


@pytest.mark.slow  # bfloat16 matmuls are emulated on CPUs without avx512_bf16 (this project's test machines)
def test_lower_precision_sampling_turns_correction_on_and_logs_the_mismatch(trainer):
    """sampling_dtype=bfloat16 with float32 training: rollout correction's `auto` switches on, the trainer
    recomputes pi_old, and the gap to the sampler's log-probs is logged as rollout/logprob_diff_*."""
    from dapo_suite.train.rollout import make_engine

    configure(trainer, ["dapo"], sampling_dtype="bfloat16")
    trainer.engine = make_engine(trainer.config, trainer.model, trainer.tokenizer)
    try:
        assert trainer.corrects_rollouts()
        groups, metrics = trainer.collect()
        assert 0 < metrics["rollout/logprob_diff_mean"] <= metrics["rollout/logprob_diff_max"] < 2.0
        assert any(key.startswith("rollout_corr/") for key in trainer.actor.update(groups))
    finally:
        configure(trainer, ["dapo"])
        trainer.engine = make_engine(trainer.config, trainer.model, trainer.tokenizer)
