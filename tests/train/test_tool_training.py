"""Multi-turn DAPO with the Python tool: the tool's tokens are context, never trained (loss, token-level
denominator, entropy, lengths, overlong penalty), the trainer's guard against steps without a gradient, and a
short real run of the `dapo-tool` preset whose calls run in the sandbox."""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
import torch

from dapo_suite.core.sandbox import isolation
from dapo_suite.inference.tool_loop import ToolCall
from dapo_suite.train.config import resolve_config
from dapo_suite.train.rollout import Rollout
from dapo_suite.train.trainer import DAPOTrainer, tool_metrics


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    config = resolve_config(
        ["dapo-tool"],
        {
            "out": str(tmp_path_factory.mktemp("tool-unit")),
            "heldout_eval": False,
            "dtype": "float32",
            "autocast_dtype": None,
            "sampling_dtype": None,
            "rollout_correction": "off",
            "tool_isolation": "unsafe-none",
        },
    )
    return DAPOTrainer(config)


def ids(trainer, text: str) -> torch.Tensor:
    return torch.tensor(trainer.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


def rollout(trainer, pieces: list[tuple[str, bool]], advantage: float, group: int = 0) -> Rollout:
    """A response of model (True) and tool (False) pieces, with its mask."""
    tokens = [ids(trainer, text) for text, _ in pieces]
    mask = torch.cat(
        [torch.full((t.numel(),), 1.0 if own else 0.0) for t, (_, own) in zip(tokens, pieces, strict=True)]
    )
    prompt = ids(trainer, trainer.prompt_text(trainer.train_problems[0]))
    result = Rollout(
        group,
        prompt,
        torch.cat(tokens),
        None,
        truncated=False,
        text="".join(t for t, _ in pieces),
        response_mask=mask,
    )
    result.advantage = advantage
    return result


def updated_weights(trainer, rollouts: list[Rollout]) -> dict[str, torch.Tensor]:
    """The weights after one real `update` on `rollouts` (pi_old filled first), the trainer restored after."""
    model_state = copy.deepcopy(trainer.model.state_dict())
    optimizer_state = copy.deepcopy(trainer.actor.optimizer.state_dict())
    scheduler_state = copy.deepcopy(trainer.actor.scheduler.state_dict())
    for r in rollouts:
        r.old_log_prob = None
    trainer.fill_old_log_probs(rollouts)
    metrics = trainer.actor.update([rollouts])
    after = {name: tensor.detach().clone() for name, tensor in trainer.model.state_dict().items()}
    trainer.model.load_state_dict(model_state)
    trainer.actor.optimizer.load_state_dict(optimizer_state)
    trainer.actor.scheduler.load_state_dict(scheduler_state)
    after["__metrics__"] = metrics
    return after


CODE = "```python\nprint(237 + 574)\n```"


def tool_variants(trainer, trained: bool) -> list[Rollout]:
    """One response whose tool output comes last (the budget ended inside it), and the same response with each
    of the tool's tokens replaced by another token: same model tokens, same shapes."""
    original = rollout(trainer, [(CODE, True), ("\n```output\n811\n```\n", False)], 1.0)
    changed = copy.deepcopy(original)
    tool = changed.mask == 0
    changed.response_ids[tool] = torch.randint(
        1000, 20000, (int(tool.sum()),), generator=torch.Generator().manual_seed(0)
    )
    if trained:
        for r in (original, changed):
            r.response_mask = torch.ones(r.length)
    return [original, changed]


def test_changing_the_tool_s_tokens_leaves_loss_and_gradient_unchanged(trainer):
    """The model's tokens, held fixed, see the same context (the tool's tokens come after them), so any change
    in the update could only come from the tool's tokens being trained: the weights after a real update are
    equal bit for bit."""
    first, second = (updated_weights(trainer, [r]) for r in tool_variants(trainer, trained=False))
    assert first["__metrics__"]["actor/pg_loss"] == second["__metrics__"]["actor/pg_loss"]
    assert first["__metrics__"]["actor/grad_norm"] == second["__metrics__"]["actor/grad_norm"] > 0
    for name in first:
        if name != "__metrics__":
            assert torch.equal(first[name], second[name]), name


def test_the_tool_s_tokens_would_change_the_update_if_they_were_trained(trainer):
    """The same two responses with the tool's tokens marked as the model's: the update differs (so the test
    above can fail)."""
    first, second = (updated_weights(trainer, [r]) for r in tool_variants(trainer, trained=True))
    assert first["__metrics__"]["actor/grad_norm"] != second["__metrics__"]["actor/grad_norm"]


def test_token_counts_entropy_and_lengths_are_the_model_s_own(trainer):
    pieces = [(CODE, True), ("\n```output\n811\n```\n", False), ("Zoe has 811 stickers.\nAnswer: 811", True)]
    response = rollout(trainer, pieces, 1.0)
    model_tokens = sum(ids(trainer, text).numel() for text, own in pieces if own)
    assert response.model_length == model_tokens < response.length
    log_prob, entropy, mask = trainer.actor.forward_log_probs([response])
    assert mask.sum().item() == model_tokens
    trainer.fill_old_log_probs([response])
    tool = response.mask == 0
    assert torch.all(response.old_log_prob[tool] == 0)  # pi_old on the model's own tokens only
    _, loss_mask = trainer.actor.correction([response])[0][id(response)]
    assert loss_mask.sum().item() == model_tokens  # the token-level denominator


def test_the_overlong_penalty_counts_the_model_s_tokens_only(trainer):
    config = trainer.config
    long_output = "\n```output\n" + "1 " * (config.max_response_length - 20) + "\n```\n"
    response = rollout(trainer, [(CODE, True), (long_output, False), ("Answer: 811", True)], 0.0)
    assert response.length > config.max_response_length - config.overlong_buffer_len  # in the penalty's zone
    problem = dataclasses.replace(trainer.train_problems[0], answer="811")
    trainer.score([response], [problem])
    assert response.score == 1.0 and response.reward == 1.0  # no penalty: the long part is the tool's


def test_an_answer_line_printed_by_the_tool_is_not_the_model_s_answer(trainer):
    response = rollout(
        trainer,
        [
            ("```python\nprint('Answer: 811')\n```", True),
            ("\n```output\nAnswer: 811\n```\n", False),
            ("I am done.", True),
        ],
        0.0,
    )
    response.model_text = "```python\nprint('Answer: 811')\n```I am done."
    problem = dataclasses.replace(trainer.train_problems[0], answer="811")
    trainer.score([response], [problem])
    assert response.acc is False


def test_no_optimiser_step_without_a_gradient(trainer):
    """A mini-batch whose advantages are all zero makes no AdamW step (which would move the weights through
    its moments and weight decay), and is counted."""
    pieces = [("Answer: 7", True)]
    weights_before = {n: t.detach().clone() for n, t in trainer.model.state_dict().items()}
    after = updated_weights(trainer, [rollout(trainer, pieces, 0.0), rollout(trainer, pieces, 0.0)])
    assert after["__metrics__"]["actor/updates"] == 0
    assert (
        after["__metrics__"]["actor/updates_skipped"] == trainer.config.ppo_epochs
    )  # one group: one mini-batch
    for name, tensor in weights_before.items():
        assert torch.equal(after[name], tensor), name
    moved = updated_weights(trainer, [rollout(trainer, pieces, 1.0), rollout(trainer, pieces, -1.0)])
    assert moved["__metrics__"]["actor/updates"] >= 1
    assert any(not torch.equal(moved[n], t) for n, t in weights_before.items())


def test_tool_metrics_count_calls_errors_and_tokens(trainer):
    from dapo_suite.inference.tool_loop import ToolCall

    calls = (ToolCall("print(1)", "ok", "1", 6, 0.01), ToolCall("1/0", "error", "ZeroDivisionError", 9, 0.01))
    with_tool = rollout(trainer, [(CODE, True), ("\n```output\n1\n```\n", False)], 0.0)
    with_tool.tool_calls = calls
    without = rollout(trainer, [("Answer: 1", True)], 0.0)
    metrics = tool_metrics([with_tool, without])
    assert metrics["tool/calls_per_response"] == 1.0 and metrics["tool/call_rate"] == 0.5
    assert metrics["tool/errors"] == 1 and metrics["tool/error_rate"] == 0.5 and metrics["tool/timeouts"] == 0
    assert metrics["tool/tokens_mean"] == (with_tool.length - with_tool.model_length) / 2


@pytest.mark.slow
def test_the_tool_preset_trains_with_calls_in_the_sandbox_and_resumes(tmp_path):
    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    out = tmp_path / "run"
    settings = {
        "out": str(out),
        "max_steps": 2,
        "heldout_eval": False,
        "save_every": 1,
        "gen_batch_size": 4,
        "group_size": 4,
        "train_batch_size": 2,
        "max_num_gen_batches": 2,
    }
    DAPOTrainer(resolve_config(["dapo-tool"], settings)).fit(progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "tool/calls_per_response" in r]
    assert len(steps) == 2
    assert sum(r["tool/calls_per_response"] for r in steps) > 0  # the model called the tool; calls ran
    assert all(
        0 < r["rollout/entropy"] < 11 for r in steps
    )  # every sampled token's entropy (log 49152 = 10.8)
    resumed = DAPOTrainer(resolve_config(["dapo-tool"], {**settings, "max_steps": 3}), resume=True)
    assert resumed.step_index == 2
    resumed.fit(progress=False)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "tool/call_rate" in r] == [1, 2, 3]


@pytest.mark.slow
def test_lora_trains_on_multi_turn_trajectories(tmp_path):
    """LoRA's adapters train on the model's tokens of tool trajectories as full fine-tuning does."""
    out = tmp_path / "lora"
    settings = {
        "out": str(out),
        "max_steps": 1,
        "heldout_eval": False,
        "gen_batch_size": 4,
        "group_size": 4,
        "train_batch_size": 2,
        "max_num_gen_batches": 2,
        "lora_rank": 8,
        "lora_alpha": 16,
        "tool_isolation": "unsafe-none",
    }
    DAPOTrainer(resolve_config(["dapo-tool"], settings)).fit(progress=False)
    record = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert record["tool/calls_per_response"] > 0 and record["actor/updates"] >= 1
    assert (out / "checkpoint-last" / "adapter_model.safetensors").is_file()


# ---- the same trajectory through verl's tool path (dapo_suite.train.verl.tool_trajectories) ----------------


def verl_reward(trainer, response: Rollout, answer: str, manager_cls, bonus: float = 0.0) -> float:
    """`response` as verl's tool agent loop returns it, its bookkeeping recorded, then scored by `manager_cls`
    with the batch verl's agent loop builds for the reward loop (experimental/agent_loop/agent_loop.py,
    `_compute_score`)."""
    from omegaconf import OmegaConf
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from dapo_suite.core.reward import compute_score
    from dapo_suite.train.verl.tool_trajectories import record_model_tokens

    config = trainer.config
    output = AgentLoopOutput(
        prompt_ids=response.prompt_ids.tolist(),
        response_ids=response.response_ids.tolist(),
        response_mask=[int(m) for m in response.mask.tolist()],
        num_turns=3,
        metrics=AgentLoopMetrics(),
    )
    record_model_tokens(output, config.max_response_length, overlong_filter=True)
    prompts, responses = torch.tensor(output.prompt_ids), torch.tensor(output.response_ids)
    input_ids = torch.cat([prompts, responses])
    batch = TensorDict(
        {
            "prompts": prompts[None],
            "responses": responses[None],
            "input_ids": input_ids[None],
            "attention_mask": torch.ones_like(input_ids)[None],
        },
        batch_size=1,
    )
    non_tensor = {
        "data_source": np.array(["dapo-suite"]),
        "reward_model": np.array([{"ground_truth": answer}], dtype=object),
        "tool_extra_fields": np.array([output.extra_fields], dtype=object),
        "__num_turns__": np.array([2 * len(response.tool_calls) + 2]),  # verl's count: prompt, 2 a call, last
    }
    reward_config = OmegaConf.create(
        {
            "reward": {
                "reward_kwargs": {
                    "max_resp_len": config.max_response_length,
                    "tool_call_bonus": bonus,
                    "tool_call_bonus_cap": config.tool_call_bonus_cap,
                    "overlong_buffer_cfg": {
                        "enable": True,
                        "len": config.overlong_buffer_len,
                        "penalty_factor": config.overlong_penalty_factor,
                        "log": False,
                    },
                }
            }
        }
    )
    manager = manager_cls(reward_config, trainer.tokenizer, compute_score)
    # verl's managers run on the event loop they were built with
    result = manager.loop.run_until_complete(
        manager.run_single(DataProto(batch=batch, non_tensor_batch=non_tensor))
    )
    return result["reward_score"]


def test_both_backends_grade_and_penalise_a_tool_trajectory_on_the_model_s_tokens(trainer):
    from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

    from dapo_suite.train.verl.tool_trajectories import ModelTokenRewardManager

    config = trainer.config
    budget = config.max_response_length - config.overlong_buffer_len
    problem = dataclasses.replace(trainer.train_problems[0], answer="811")
    # the model's own tokens a few into the penalty's zone, the tool's output on top of them up to the limit,
    # ending in an answer line the model never wrote
    reasoning, closing = "Let me add.", "\nI am done."
    while len(ids(trainer, reasoning + CODE)) + len(ids(trainer, closing)) <= budget + 2:
        reasoning += " Add them."
    model_tokens = len(ids(trainer, reasoning + CODE)) + len(ids(trainer, closing))
    assert model_tokens <= config.max_response_length - 16
    tool_part = "\n```output\nAnswer: 811\n```\n"
    while (
        model_tokens + len(ids(trainer, tool_part.replace("Answer", "1\nAnswer")))
        <= config.max_response_length
    ):
        tool_part = tool_part.replace("Answer", "1\nAnswer")
    response = rollout(trainer, [(reasoning + CODE, True), (tool_part, False), (closing, True)], 0.0)
    response.model_text = reasoning + CODE + closing
    assert response.model_length == model_tokens and response.length <= config.max_response_length
    trainer.score([response], [problem])
    assert response.acc is False and -1.5 < response.reward < -1.0  # wrong, and a small penalty
    assert verl_reward(trainer, response, "811", ModelTokenRewardManager) == pytest.approx(response.reward)
    # verl's own manager grades the tool's answer line and counts the tool's tokens toward the penalty
    verls = verl_reward(trainer, response, "811", DAPORewardManager)
    assert verls == pytest.approx(1.0 + (budget - response.length) / config.overlong_buffer_len)
    # ReTool's shaping (the retool preset's tool_call_bonus) on both: the wrong answer gains 0.1 for its call
    response.tool_calls = (ToolCall(CODE, "ok", "Answer: 811", 12, 0.01),)
    penalty = response.reward - response.score
    trainer.config = dataclasses.replace(config, tool_call_bonus=0.1)
    try:
        trainer.score([response], [problem])
    finally:
        trainer.config = config
    assert response.reward == pytest.approx(-0.9 + penalty)
    shaped = verl_reward(trainer, response, "811", ModelTokenRewardManager, bonus=0.1)
    assert shaped == pytest.approx(response.reward)


def test_on_verl_a_truncated_tool_trajectory_carries_no_loss_under_overlong_filtering(trainer):
    from verl.experimental.agent_loop.agent_loop import AgentLoopMetrics, AgentLoopOutput

    from dapo_suite.train.verl.tool_trajectories import MODEL_MASK, TRUNCATED, record_model_tokens

    limit = 24
    mask = [1] * 8 + [0] * 10 + [1] * 6  # model, tool, model: the limit reached with 14 of the model's tokens
    for overlong_filter, length in ((True, limit), (False, limit), (True, limit - 1)):
        output = AgentLoopOutput(
            prompt_ids=[1, 2],
            response_ids=list(range(length)),
            response_mask=mask[:length],
            num_turns=3,
            metrics=AgentLoopMetrics(),
        )
        record_model_tokens(output, limit, overlong_filter)
        truncated = length >= limit
        assert output.extra_fields[TRUNCATED] is truncated
        assert output.extra_fields[MODEL_MASK] == mask[:length]
        assert sum(output.response_mask) == (0 if truncated and overlong_filter else sum(mask[:length]))
