"""Same objective, same numbers: verl's actor and the embedded trainer on one fixed batch.

The batch: 2 prompts x 4 responses of the embedded model (fixed token ids: the project's chat prompt, short
answers ending in <|im_end|>); old log-probs = the model's own, perturbed so that ratios leave the trust
region on both sides and one token passes the dual-clip bound; advantages from the group rewards (GRPO, both
signs). Both backends run the `dapo` preset (tiny-cpu scale) in float32, without autocast and without rollout
correction:

- embedded: `DAPOTrainer.actor.update` (one mini-batch of two groups, two micro-batches), which reports
  `actor/pg_loss` and `actor/grad_norm` (before clipping);
- verl 0.9.1, in this process on the CPU: verl's own actor worker, `ActorRolloutRefWorker(role="actor")`,
  built from the project's override list (`build_overrides` with `Hardware(device="cpu")`: float32 FSDP mixed
  precision when autocast is off, the model's own pad token id; see `verl_actor_config`). It builds the FSDP2
  engine on a one-rank gloo group, `ppo_loss` with the registered `dapo_overlong_filter` loss, AdamW and grad
  clipping; the batch goes in as verl's trainer sends it (`DataProto` -> `left_right_2_no_padding` ->
  `update_actor`), and verl's own metrics give loss and grad norm.

Without a truncated response, loss and grad norm agree to 1e-5 (relative). With one, they differ by exactly
the share of kept tokens: the embedded token-mean divides by the tokens of the responses that train, verl's by
`batch_num_tokens = loss_mask.sum()`, which the engine counts before the loss runs and which still holds the
truncated response's tokens (the deviation dapo_suite/train/verl/extensions.py documents).
"""

from __future__ import annotations

import gc
import os
from dataclasses import dataclass

import pytest
import torch

from dapo_suite.core.ports import free_port
from dapo_suite.core.prompts import chat_messages, render_chat
from dapo_suite.inference.models import eval_mode
from dapo_suite.train.config import TrainConfig, resolve_config
from dapo_suite.train.rollout import Rollout

pytestmark = (
    pytest.mark.slow
)  # 3 trainers and 2 verl engines of a 135M model: 1.5-6 minutes on 2 shared cores

L_MAX = 16  # max_response_length: a response of L_MAX tokens without EOS is truncated
RELATIVE_TOLERANCE = 1e-5
PROMPTS = ("What is 3 + 4?", "What is 12 - 5?")
# (response text, reward) per prompt; each text is tokenised and ends with the end-of-turn token (< L_MAX
# tokens)
RESPONSES = (
    (("7", 1.0), ("The answer is 7.", 1.0), ("3 + 4 = 8", -1.0), ("Answer: 7", 1.0)),
    (("7", 1.0), ("12 - 5 = 7, so 7.", 1.0), ("6", -1.0), ("The answer is 17.", -1.0)),
)
# replaces the last response of the second prompt in the batch with a truncated one (L_MAX tokens, no EOS)
TRUNCATED_TEXT = "Let me think step by step about what happens when five is taken away from twelve"
OLD_LOG_PROB_NOISE = 0.3  # std of the perturbation of log pi_old: ratios around exp(+-0.3) leave [0.8, 1.28]
DUAL_CLIP_SHIFT = 3.0  # one negative-advantage token: ratio ~ e^3 > clip_c = 10


@dataclass
class Numbers:
    loss: float
    grad_norm: float


def dapo_config(out: str) -> TrainConfig:
    """The `dapo` preset at tiny-cpu scale, float32 without autocast or rollout correction: one update of two
    groups of four, in two micro-batches of four responses."""
    # as `--set key=value` settings: a None there turns off what tiny-cpu sets (`autocast_dtype: auto` is bf16
    # on CPUs with native bf16), where a None among flag overrides would mean "not given"
    config = resolve_config(
        ["tiny-cpu", "dapo"],
        settings={
            "out": out,
            "dtype": "float32",
            "autocast_dtype": None,
            "sampling_dtype": None,
            "rollout_correction": "off",
            "temperature": 1.0,
            "max_response_length": L_MAX,
            "overlong_buffer_len": 4,
            "group_size": 4,
            "train_batch_size": 2,
            "gen_batch_size": 2,
            "mini_batch_size": 2,
            "micro_batch_size": 4,
            "ppo_epochs": 1,
        },
    )
    assert config.autocast_dtype is None and config.sampling_dtype is None and config.overlong_filter
    return config


# ---- the fixed batch
# --------------------------------------------------------------------------------------------


def fixed_groups(trainer, truncated: bool) -> list[list[Rollout]]:
    """2 groups x 4 rollouts with token ids, rewards, advantages (the trainer's GRPO) and perturbed old
    log-probs (the trainer's own forward pass). With `truncated`, the last response of the second group is cut
    at L_MAX."""
    tokenizer = trainer.tokenizer
    end_of_turn = trainer.model.generation_config.eos_token_id  # <|im_end|>, where the sampler stops
    groups = []
    for group, (problem, responses) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        prompt_ids = torch.tensor(
            tokenizer(render_chat(tokenizer, chat_messages(problem)), add_special_tokens=False)["input_ids"]
        )
        rollouts = []
        for text, reward in responses:
            ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [end_of_turn]
            assert len(ids) < L_MAX
            rollouts.append(
                Rollout(
                    group=group,
                    prompt_ids=prompt_ids,
                    response_ids=torch.tensor(ids),
                    old_log_prob=None,
                    truncated=False,
                    text=text,
                    reward=reward,
                )
            )
        groups.append(rollouts)
    if truncated:
        ids = tokenizer(TRUNCATED_TEXT, add_special_tokens=False)["input_ids"][:L_MAX]
        assert len(ids) == L_MAX
        groups[1][-1] = Rollout(
            group=1,
            prompt_ids=groups[1][-1].prompt_ids,
            response_ids=torch.tensor(ids),
            old_log_prob=None,
            truncated=True,
            text=TRUNCATED_TEXT,
            reward=-1.0,
        )
    trainer.assign_advantages(groups)
    perturb_old_log_probs(trainer, [r for group in groups for r in group])
    return groups


@torch.no_grad()
def perturb_old_log_probs(trainer, rollouts: list[Rollout]) -> None:
    """log pi_old = the model's log-probs + seeded noise, and one negative-advantage token far below
    pi_theta."""
    with eval_mode(trainer.model):
        log_prob, _, _ = trainer.actor.forward_log_probs(rollouts)
    noise = torch.Generator().manual_seed(0)
    for row, rollout in enumerate(rollouts):
        rollout.old_log_prob = log_prob[row, : rollout.length] + OLD_LOG_PROB_NOISE * torch.randn(
            rollout.length, generator=noise
        )
    negative = next(r for r in rollouts if r.advantage < 0 and not r.truncated)
    negative.old_log_prob[0] -= DUAL_CLIP_SHIFT


def token_counts(groups: list[list[Rollout]]) -> tuple[int, int]:
    """(response tokens that carry loss in the embedded trainer, all response tokens of the batch)."""
    rollouts = [r for group in groups for r in group]
    return sum(r.length for r in rollouts if not r.truncated), sum(r.length for r in rollouts)


# ---- embedded trainer
# -----------------------------------------------------------------------------------------


def embedded_update(config: TrainConfig, groups: list[list[Rollout]]) -> tuple[Numbers, dict[str, float]]:
    """One `DAPOTrainer.actor.update` from the model as loaded: its loss and grad norm (and all its
    metrics)."""
    from dapo_suite.train.trainer import DAPOTrainer

    trainer = DAPOTrainer(config)
    metrics = trainer.actor.update(groups)
    assert metrics["actor/updates"] == 1
    del trainer
    gc.collect()
    return Numbers(metrics["actor/pg_loss"], metrics["actor/grad_norm"]), metrics


# ---- verl's actor
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def verl_on_this_cpu():
    """This process as rank 0 of a one-rank verl job on the CPU: the project's CPU platform (by name, as the
    launcher selects it), verl's engine lookup override, L_max for the overlong-filter loss, and a gloo
    process group on 127.0.0.1. The environment is restored afterwards (verl's Worker writes rank variables
    into it)."""
    saved_environment = dict(os.environ)
    port = free_port()
    os.environ.update(
        {
            "VERL_PLATFORM": "cpu",
            "VERL_ENGINE_DEVICE": "cuda",
            "DAPO_SUITE_MAX_RESPONSE_LENGTH": str(L_MAX),
            "WORLD_SIZE": "1",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )
    from verl.plugin.platform import platform_manager

    from dapo_suite.train.verl.cpu_platform import PlatformCPU

    previous_platform = platform_manager._current_platform  # verl's singleton, None until first asked for
    if platform_manager.get_platform().device_name != "cpu":  # another test asked verl for its platform first
        platform_manager.set_platform(PlatformCPU())
    # verl's own backend string; cpu_platform turns "cpu:gloo,cpu:gloo" into gloo
    torch.distributed.init_process_group(
        backend="cpu:gloo,cpu:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        yield
    finally:
        torch.distributed.destroy_process_group()
        platform_manager._current_platform = previous_platform
        os.environ.clear()
        os.environ.update(saved_environment)


def verl_actor_config(config: TrainConfig, padding_idx: int):
    """verl's composed `actor_rollout_ref` for the run: the project's override list for a one-"GPU" CPU run,
    and the step count verl's trainer fills in from the data. Two of its keys are what the same numbers need:

    - float32 FSDP mixed precision (`cpu_keys.cpu_overrides`, autocast off): verl's FSDP actor otherwise
      computes in bf16 (its default param_dtype), whatever `dtype` / `autocast_dtype` say;
    - the model's own pad token id (`keys.model_overrides`): verl replaces the model config's pad_token_id
      with the tokenizer's, and the embedded tokenizer (converted from GGUF) has no pad token and eos
      <|im_start|> (id 1), so verl would take 1 where config.json says 2 (<|im_end|>). The id becomes
      `nn.Embedding(padding_idx=...)`, whose row gets no gradient from the input side: with the other id the
      two trainers update different rows of the tied embedding, and the grad norms differ by 2e-5 (no
      truncation) to 2e-4 (one truncated) relative."""
    from dapo_suite.train.verl import Hardware, build_overrides, compose

    overrides = build_overrides(
        config,
        Hardware(nnodes=1, gpus_per_node=1, device="cpu"),
        passthrough=[f"actor_rollout_ref.actor.optim.total_training_steps={config.max_steps}"],
    )
    mixed = "actor_rollout_ref.actor.fsdp_config.mixed_precision"
    assert {
        f"+{mixed}.param_dtype=fp32",
        f"+actor_rollout_ref.model.override_config.pad_token_id={padding_idx}",
    } <= set(overrides)
    cfg = compose(overrides)
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == "dapo_overlong_filter" and actor.loss_agg_mode == "token-mean"
    assert actor.strategy == "fsdp2" and actor.entropy_coeff == 0 and not actor.use_kl_loss
    return cfg.actor_rollout_ref


def verl_batch(groups: list[list[Rollout]], pad_token_id: int, actor_rollout_ref):
    """The batch as verl's trainer hands it to the actor (`RayPPOTrainer._update_actor`): left-padded prompts,
    right-padded responses, token-level advantages, converted to verl's no-padding TensorDict."""
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.utils.padding import left_right_2_no_padding

    rollouts = [r for group in groups for r in group]
    prompt_len = max(r.prompt_ids.numel() for r in rollouts)
    response_len = max(r.length for r in rollouts)

    def pad(values: torch.Tensor, width: int, left: bool, fill: float = 0) -> torch.Tensor:
        padding = torch.full((width - values.numel(),), fill, dtype=values.dtype)
        return torch.cat([padding, values] if left else [values, padding])

    prompts = torch.stack([pad(r.prompt_ids, prompt_len, True, pad_token_id) for r in rollouts])
    responses = torch.stack([pad(r.response_ids, response_len, False, pad_token_id) for r in rollouts])
    attention_mask = torch.stack(
        [
            torch.cat(
                [
                    pad(torch.ones(r.prompt_ids.numel(), dtype=torch.long), prompt_len, True),
                    pad(torch.ones(r.length, dtype=torch.long), response_len, False),
                ]
            )
            for r in rollouts
        ]
    )
    response_mask = attention_mask[:, prompt_len:]
    old_log_probs = torch.stack([pad(r.old_log_prob.float(), response_len, False) for r in rollouts])
    advantages = torch.tensor([r.advantage for r in rollouts]).unsqueeze(-1) * response_mask
    batch = DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=-1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
            "old_log_probs": old_log_probs,
            "advantages": advantages,
        },
        meta_info={"temperature": actor_rollout_ref.rollout.temperature, "multi_turn": False},
    )
    data = left_right_2_no_padding(batch.to_tensordict())
    actor = actor_rollout_ref.actor
    mini_batch_size = actor.ppo_mini_batch_size * actor_rollout_ref.rollout.n
    tu.assign_non_tensor(
        data,
        calculate_entropy=actor.calculate_entropy or actor.entropy_coeff != 0,
        distillation_use_topk=False,
        distillation_only=False,
        global_batch_size=mini_batch_size,
        mini_batch_size=mini_batch_size,
        epochs=actor.ppo_epochs,
        seed=actor.data_loader_seed,
        dataloader_kwargs={"shuffle": actor.shuffle},
        compute_loss=True,
    )
    return data


def verl_update(
    config: TrainConfig, groups: list[list[Rollout]], pad_token_id: int, padding_idx: int
) -> tuple[Numbers, dict]:
    """verl's actor worker, built as its trainer builds it, runs `update_actor` on the batch; verl's reduced
    metrics give the loss (`actor/pg_loss`, summed over micro-batches) and the grad norm before clipping."""
    from verl.utils import tensordict_utils as tu
    from verl.utils.metric import reduce_metrics
    from verl.workers.engine_workers import ActorRolloutRefWorker

    actor_rollout_ref = verl_actor_config(config, padding_idx)
    worker = ActorRolloutRefWorker(config=actor_rollout_ref, role="actor")
    worker.init_model()
    engine = worker.actor.engine
    assert type(engine).__name__ == "FSDPEngineWithLMHead"
    assert engine._autocast_dtype == torch.float32  # forward without autocast
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())
    assert engine.module.get_input_embeddings().padding_idx == padding_idx
    output = worker.update_actor(verl_batch(groups, pad_token_id, actor_rollout_ref))
    metrics = reduce_metrics(tu.get(output, "metrics"))
    del worker, engine
    gc.collect()
    return Numbers(float(metrics["actor/pg_loss"]), float(metrics["grad_norm"])), metrics


# ---- both, on both batches ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results(tmp_path_factory, embedded_model_dir, verl_on_this_cpu):
    """{batch name: (embedded numbers, verl numbers, embedded metrics, (loss tokens, all tokens))}. The
    trainers run one after the other from the model as loaded, so only one copy of the model and its AdamW
    state is alive."""
    from dapo_suite.train.trainer import DAPOTrainer

    config = dapo_config(str(tmp_path_factory.mktemp("embedded")))
    builder = DAPOTrainer(
        config
    )  # the batches' old log-probs and advantages come from the project's own code
    batches = {
        "no_truncation": fixed_groups(builder, truncated=False),
        "one_truncated": fixed_groups(builder, truncated=True),
    }
    pad_token_id = builder.tokenizer.pad_token_id
    padding_idx = builder.model.get_input_embeddings().padding_idx  # config.json's pad_token_id
    del builder
    gc.collect()
    out = {}
    for name, groups in batches.items():
        embedded, embedded_metrics = embedded_update(config, groups)
        verl, _ = verl_update(config, groups, pad_token_id, padding_idx)
        out[name] = (embedded, verl, embedded_metrics, token_counts(groups))
    return out


def test_verl_actor_computes_the_embedded_loss_and_grad_norm(results):
    embedded, verl, metrics, (kept, total) = results["no_truncation"]
    assert kept == total
    # the batch exercises the clipped objective: ratios clipped on both sides, one past the dual-clip bound
    assert metrics["actor/clipfrac_upper"] > 0 and metrics["actor/clipfrac_lower"] > 0
    assert metrics["actor/dual_clipfrac"] > 0
    assert verl.loss == pytest.approx(embedded.loss, rel=RELATIVE_TOLERANCE)
    assert verl.grad_norm == pytest.approx(embedded.grad_norm, rel=RELATIVE_TOLERANCE)


def test_a_truncated_response_stays_in_verls_token_mean_denominator(results):
    """Overlong filtering: both exclude the truncated response from the loss, but verl's token-mean still
    divides by its tokens (`batch_num_tokens` = `loss_mask.sum()` before the loss runs). Loss and gradient are
    the embedded ones times kept/all tokens; when verl's denominator drops truncated tokens this becomes
    equality."""
    embedded, verl, _, (kept, total) = results["one_truncated"]
    assert kept == total - L_MAX
    assert verl.loss == pytest.approx(embedded.loss * kept / total, rel=RELATIVE_TOLERANCE)
    assert verl.grad_norm == pytest.approx(embedded.grad_norm * kept / total, rel=RELATIVE_TOLERANCE)
