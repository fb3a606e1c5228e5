"""The verl override builder, checked against verl 0.9.1's own composed Hydra config (CPU, no Ray)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner
from omegaconf import OmegaConf

from dapo_suite.train import verl as vb
from dapo_suite.train.config import LADDER, SUCCESSORS, TrainConfig, resolve_config

# The paper's 32B run (docs dapo-reference.md section 2), as verl keys and values.
PAPER_32B = {
    "algorithm.adv_estimator": "grpo",
    "algorithm.norm_adv_by_std_in_grpo": True,
    "algorithm.use_kl_in_reward": False,
    "actor_rollout_ref.actor.use_kl_loss": False,
    "actor_rollout_ref.actor.clip_ratio_low": 0.2,
    "actor_rollout_ref.actor.clip_ratio_high": 0.28,
    "actor_rollout_ref.actor.clip_ratio_c": 10.0,
    "actor_rollout_ref.actor.loss_agg_mode": "token-mean",
    "data.max_prompt_length": 2048,
    "data.max_response_length": 20480,
    "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
    "reward.reward_kwargs.overlong_buffer_cfg.len": 4096,
    "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
    "reward.reward_kwargs.max_resp_len": 20480,
    "reward.reward_manager.name": "dapo",
    "reward.custom_reward_function.path": "pkg://dapo_suite.core.reward",
    "reward.custom_reward_function.name": "compute_score",
    "algorithm.filter_groups.enable": True,
    "algorithm.filter_groups.metric": "acc",
    "algorithm.filter_groups.max_num_gen_batches": 10,
    "data.train_batch_size": 512,
    "data.gen_batch_size": 1536,
    "actor_rollout_ref.rollout.n": 16,
    "actor_rollout_ref.actor.ppo_mini_batch_size": 32,
    "actor_rollout_ref.actor.optim.lr": 1e-6,
    # the recipe's "constant" is verl's constant-with-warm-up, whose step 1 runs at lr 0; "cosine" with no
    # cycle and one-indexed steps is the same schedule from step 2 on, and gives step 1 lr / warm-up steps
    "actor_rollout_ref.actor.optim.lr_scheduler_type": "cosine",
    "actor_rollout_ref.actor.optim.num_cycles": 0.0,
    "actor_rollout_ref.actor.optim.lr_warmup_steps": 10,
    "actor_rollout_ref.actor.optim.weight_decay": 0.1,
    "actor_rollout_ref.actor.grad_clip": 1.0,
    "actor_rollout_ref.actor.optim.clip_grad": 1.0,
    "actor_rollout_ref.rollout.temperature": 1.0,
    "actor_rollout_ref.rollout.top_p": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.temperature": 1.0,
    "actor_rollout_ref.rollout.val_kwargs.top_p": 0.7,
    "actor_rollout_ref.rollout.val_kwargs.n": 32,
    "actor_rollout_ref.rollout.val_kwargs.do_sample": True,
    "trainer.nnodes": 16,
    "trainer.n_gpus_per_node": 8,
    "actor_rollout_ref.rollout.name": "vllm",
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 4,
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 8,
    "actor_rollout_ref.actor.fsdp_config.param_offload": True,
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True,
    # overlong filtering (sec. 3.4) through the registered loss
    "actor_rollout_ref.actor.policy_loss.loss_mode": "dapo_overlong_filter",
    "actor_rollout_ref.model.external_lib": "dapo_suite.train.verl.extensions",
}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("data")
    vb.write_aime24_parquet(root / "val.parquet")
    vb.write_aime24_parquet(root / "train.parquet")
    return root


def _config(data: Path, tmp: Path, presets=("dapo",), **values) -> TrainConfig:
    base = {
        "model": "Qwen/Qwen2.5-32B",
        "train_file": str(data / "train.parquet"),
        "val_file": str(data / "val.parquet"),
        "out": str(tmp / "run"),
        "backend": "verl",
    }
    return resolve_config(list(presets), {**base, **values})


def test_every_trainconfig_field_is_mapped_or_explained():
    mapped = {row.field for row in vb.VERL_KEYS}
    names = {f.name for f in fields(TrainConfig)}
    assert mapped | set(vb.NOT_MAPPED) == names
    assert not mapped & set(vb.NOT_MAPPED)


def test_paper_32b_dry_run_matches_the_reference_table_key_by_key(data, tmp_path):
    config = _config(data, tmp_path)
    plan = vb.dry_run(config, vb.Hardware(nnodes=16, gpus_per_node=8))
    cfg = plan["config"]
    for key, expected in PAPER_32B.items():
        assert OmegaConf.select(cfg, key) == expected, key
    # the legacy keys verl 0.9 no longer reads are not used
    assert not any(
        o.startswith(("reward_model.overlong", "+reward_model.overlong")) for o in plan["overrides"]
    )
    # the recipe's bound on dynamic sampling, enforced by the project's replay buffer (verl's V1 ignores it)
    assert cfg.trainer.v1.sampler.custom_sampler.name == "CappedDAPOReplayBuffer"
    assert cfg.trainer.v1.sampler.sampler_kwargs.max_filtered_groups == 10 * 1536
    # the written YAML is the composed config
    written = OmegaConf.load(tmp_path / "run" / "verl_config.yaml")
    for key, expected in PAPER_32B.items():
        assert OmegaConf.select(written, key) == expected, key
    assert (tmp_path / "run" / "config.yaml").is_file()
    # Ray accepts only string env values (found by the CPU launch attempt)
    assert cfg.ray_kwargs.ray_init.runtime_env.env_vars.DAPO_SUITE_MAX_RESPONSE_LENGTH == "20480"
    assert "verl.trainer.main_ppo" in (tmp_path / "run" / "verl_command.sh").read_text()


@pytest.mark.parametrize("preset", LADDER)
def test_every_preset_composes_at_1x1_1x8_16x8(preset, data, tmp_path):
    config = _config(data, tmp_path, presets=(preset,))
    switches = resolve_config([preset], {"model": "Qwen/Qwen2.5-32B"})
    for nnodes, gpus in ((1, 1), (1, 8), (16, 8)):
        hw = vb.Hardware(nnodes=nnodes, gpus_per_node=gpus)
        cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
        actor = cfg.actor_rollout_ref.actor
        assert actor.clip_ratio_high == switches.clip_high
        assert actor.loss_agg_mode == switches.loss_agg
        assert cfg.algorithm.filter_groups.enable == switches.dynamic_sampling
        assert cfg.reward.reward_kwargs.overlong_buffer_cfg.enable == switches.overlong_penalty
        assert actor.policy_loss.loss_mode == (
            "dapo_overlong_filter" if switches.overlong_filter else "vanilla"
        )
        assert cfg.data.gen_batch_size == (1536 if switches.dynamic_sampling else 512)
        assert cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node == nnodes * gpus


@pytest.mark.parametrize("preset", SUCCESSORS)
def test_every_successor_preset_composes_with_its_loss_and_knobs(preset, data, tmp_path):
    config = _config(data, tmp_path, presets=(preset,))
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
    actor = cfg.actor_rollout_ref.actor
    assert actor.policy_loss.loss_mode == f"dapo_overlong_filter_{config.loss_mode}"
    assert (actor.clip_ratio_low, actor.clip_ratio_high) == (config.clip_low, config.clip_high)
    assert actor.loss_agg_mode == config.loss_agg
    for knob in ("clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef"):
        assert actor.policy_loss[knob] == getattr(config, knob), knob
    assert (actor.tau_pos, actor.tau_neg) == (config.tau_pos, config.tau_neg)
    # without overlong filtering verl runs its own registered loss
    plain = dataclasses.replace(config, overlong_filter=False)
    cfg, _ = vb.validate(plain, hw, vb.build_overrides(plain, hw))
    assert cfg.actor_rollout_ref.actor.policy_loss.loss_mode == config.loss_mode


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"rollout_is": "token", "rollout_is_threshold": 2.0, "rollout_rs": None}),
        (
            {"rollout_correction": "off", "rollout_rs": "seq_mean_k3", "rollout_rs_threshold": "0.01"},
            {"rollout_is": None, "rollout_rs": None},
        ),
        (
            {
                "rollout_is": "sequence",
                "rollout_is_threshold": "0.5_5.0",
                "rollout_is_batch_normalize": True,
                "rollout_rs": "token_k1,seq_max_k2",
                "rollout_rs_threshold": "0.5_2.0,0.1",
            },
            {
                "rollout_is": "sequence",
                "rollout_is_threshold": "0.5_5.0",
                "rollout_is_batch_normalize": True,
                "rollout_rs": "token_k1,seq_max_k2",
                "rollout_rs_threshold": "0.5_2.0,0.1",
            },
        ),
    ],
)
def test_rollout_correction_maps_to_verls_keys(values, expected, data, tmp_path):
    config = _config(data, tmp_path, **values)
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
    for key, value in expected.items():
        assert cfg.algorithm.rollout_correction[key] == value, key


@pytest.mark.parametrize(
    ("estimator", "norm", "by_std"),
    [
        ("rloo", None, True),
        ("grpo", "none", False),
        ("grpo_passk", "group", True),
        ("reinforce_plus_plus_baseline", None, True),
    ],
)
def test_advantage_estimators_map_to_verls(estimator, norm, by_std, data, tmp_path):
    config = _config(data, tmp_path, adv_estimator=estimator, adv_norm=norm)
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
    assert cfg.algorithm.adv_estimator == estimator and cfg.algorithm.norm_adv_by_std_in_grpo == by_std


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {"lora_rank": 0, "lora_alpha": 16, "target_modules": "all-linear"}),
        (
            {"lora_rank": 16, "lora_alpha": 32.0},
            {"lora_rank": 16, "lora_alpha": 32, "target_modules": "all-linear"},
        ),
        (
            {"lora_rank": 8, "lora_targets": "q_proj, v_proj"},
            {"lora_rank": 8, "target_modules": ["q_proj", "v_proj"]},
        ),
    ],
)
def test_lora_keys_map_to_verls_model_config(values, expected, data, tmp_path):
    config = _config(data, tmp_path, **values)
    for hw in (vb.Hardware(nnodes=1, gpus_per_node=8), vb.Hardware(nnodes=16, gpus_per_node=8)):
        cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
        for key, value in expected.items():
            assert OmegaConf.to_object(cfg.actor_rollout_ref.model)[key] == value, key
    assert isinstance(cfg.actor_rollout_ref.model.lora_alpha, int)  # verl's ModelConfig types it int


def test_lora_on_verls_cpu_path_merges_the_adapters_and_says_what_blocks_it_unmerged(data, tmp_path):
    config = _config(data, tmp_path, lora_rank=16)
    cpu, gpu = vb.Hardware(nnodes=1, gpus_per_node=1, device="cpu"), vb.Hardware(nnodes=1, gpus_per_node=8)
    cfg, _ = vb.validate(config, cpu, vb.build_overrides(config, cpu))
    assert cfg.actor_rollout_ref.model.lora_rank == 16 and cfg.actor_rollout_ref.model.lora.merge
    with pytest.raises(vb.VerlConfigError) as error:
        vb.validate(
            config, cpu, vb.build_overrides(config, cpu, ["actor_rollout_ref.model.lora.merge=False"])
        )
    assert "vLLM-CPU takes new weights only whole" in str(error.value) and "--device cuda" in str(error.value)
    # on GPUs verl's default stays: adapters synced apart from the base weights
    assert not vb.validate(config, gpu, vb.build_overrides(config, gpu))[0].actor_rollout_ref.model.lora.merge


def test_a_cpu_runs_sync_trainer_gives_its_workers_every_core_and_the_async_ones_rays_default(
    data, tmp_path, monkeypatch
):
    """Ray starts an actor without num_cpus at one OpenMP thread: the sync trainer's rollout and update take
    turns, so its CPU workers get the cores this process may use (or the thread count the user set); the async
    trainers, whose rollout and update overlap, keep Ray's default."""
    import os

    def worker_threads(config: TrainConfig) -> object:
        cpu = vb.Hardware(nnodes=1, gpus_per_node=1 if config.async_mode == "off" else 2, device="cpu")
        return vb.validate(config, cpu, vb.build_overrides(config, cpu))[
            0
        ].ray_kwargs.ray_init.runtime_env.env_vars.get("OMP_NUM_THREADS")

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("DAPO_SUITE_THREADS", raising=False)
    assert worker_threads(_config(data, tmp_path)) == str(
        len(os.sched_getaffinity(0))
    )  # Ray takes strings only
    monkeypatch.setenv("DAPO_SUITE_THREADS", "1")
    assert worker_threads(_config(data, tmp_path)) == "1"
    assert worker_threads(_config(data, tmp_path, async_mode="one_step")) is None


BAD_INPUTS = [
    (
        "batch-level std",
        {"adv_norm": "batch"},
        {},
        [],
        "adv_norm 'batch' (Lite PPO's batch-level std) does not",
    ),
    (
        "unknown key",
        {},
        {},
        ["actor_rollout_ref.actor.clip_ratio_hi=0.3"],
        "unknown verl key 'actor_rollout_ref.actor.clip_ratio_hi'",
    ),
    ("wrong type (number)", {}, {}, ["data.train_batch_size=abc"], "data.train_batch_size must be a number"),
    (
        "wrong type (bool)",
        {},
        {},
        ["algorithm.filter_groups.enable=maybe"],
        "algorithm.filter_groups.enable must be a boolean",
    ),
    ("TP does not divide GPUs", {}, {"rollout_tp": 3}, [], "rollout tensor parallel size 3 must divide"),
    (
        "SP does not divide GPUs",
        {},
        {"gpus_per_node": 6, "rollout_tp": 2, "ulysses_sp": 4},
        [],
        "Ulysses sequence parallel size 4 must divide the number of GPUs (6)",
    ),
    (
        "batch not divisible by DP",
        {"train_batch_size": 10, "mini_batch_size": 5, "group_size": 2},
        {"ulysses_sp": 1},
        [],
        "= 20 is not divisible by the 8 GPUs",
    ),
    (
        "mini-batch larger than batch",
        {},
        {},
        ["actor_rollout_ref.actor.ppo_mini_batch_size=1024"],
        "mini-batch (1024 prompts) is larger than the batch (512 prompts)",
    ),
    (
        "sequence longer than tokens per GPU",
        {},
        {},
        ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1024"],
        "prompt+response = 22528 tokens exceeds the token budget",
    ),
    (
        "model path missing",
        {"model": "/nonexistent/model"},
        {},
        [],
        "model path '/nonexistent/model' does not exist",
    ),
    (
        "model neither dir, hub id nor short name",
        {"model": "Qwen2.5-33B"},
        {},
        [],
        "model path 'Qwen2.5-33B' does not exist (give a local HF directory or a hub id like "
        "Qwen/Qwen2.5-32B; short names resolve for Qwen2.5-*",
    ),
    (
        "train file missing",
        {"train_file": "/nonexistent/train.parquet"},
        {},
        [],
        "train-file '/nonexistent/train.parquet' does not exist",
    ),
    ("no HF rollout in verl", {"rollout_engine": "hf"}, {}, [], "rollout_engine 'hf' does not exist in verl"),
    ("verl's own check", {}, {}, ["actor_rollout_ref.actor.loss_agg_mode=foo"], "Invalid loss_agg_mode: foo"),
    (
        "LoRA alpha not an integer",
        {"lora_rank": 16, "lora_alpha": 7.5},
        {},
        [],
        "actor_rollout_ref.model.lora_alpha must be an integer",
    ),
    ("LoRA rank beyond vLLM's", {"lora_rank": 1024}, {}, [], "lora_rank must be less than or equal to 512"),
    (
        "micro-batch needed without dynamic bsz",
        {},
        {},
        ["actor_rollout_ref.actor.use_dynamic_bsz=False"],
        "ppo_micro_batch_size_per_gpu",
    ),
]


@pytest.mark.parametrize(
    ("case", "values", "hardware", "passthrough", "message"), BAD_INPUTS, ids=[case[0] for case in BAD_INPUTS]
)
def test_bad_inputs_fail_with_their_message(case, values, hardware, passthrough, message, data, tmp_path):
    config = dataclasses.replace(_config(data, tmp_path), **values)
    hw = vb.Hardware(**{"nnodes": 1, "gpus_per_node": 8, **hardware})
    with pytest.raises(vb.VerlConfigError) as error:
        vb.validate(config, hw, vb.build_overrides(config, hw, passthrough))
    assert message in str(error.value)


def test_a_short_name_reaches_verl_as_its_hub_id(data, tmp_path):
    config = _config(data, tmp_path, model="Qwen2.5-32B")
    overrides = vb.build_overrides(config, vb.Hardware(nnodes=2, gpus_per_node=8))
    assert "actor_rollout_ref.model.path=Qwen/Qwen2.5-32B" in overrides
    vb.validate(config, vb.Hardware(nnodes=2, gpus_per_node=8), overrides)


def test_the_gpus_a_refused_run_is_sent_to_pass_verls_own_checks(data, tmp_path):
    """memory.verl_plan's layout for the paper's 32B run (full fine-tuning, then LoRA) is what the dry run
    takes: verl's composed config, its validate_config and the resource arithmetic accept it."""
    from dapo_suite.inference.hub import MODELS
    from dapo_suite.train.memory import verl_plan
    from dapo_suite.train.verl.gpus import GPU_BYTES, GPU_SHARE

    shape = MODELS["Qwen2.5-32B"][1]
    for config, gpus in (
        (_config(data, tmp_path), 16),
        (_config(data, tmp_path, lora_rank=64, lora_alpha=64), 4),
    ):
        plan = verl_plan(config, shape)
        assert plan.hardware.gpus == gpus
        assert plan.state_per_gpu + plan.rollout_per_gpu <= GPU_SHARE * GPU_BYTES
        vb.validate(config, plan.hardware, vb.build_overrides(config, plan.hardware))


def test_passthrough_replaces_a_generated_key(data, tmp_path):
    config = _config(data, tmp_path)
    overrides = vb.build_overrides(
        config, vb.Hardware(), ["actor_rollout_ref.rollout.gpu_memory_utilization=0.6"]
    )
    assert [o for o in overrides if "gpu_memory_utilization" in o] == [
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.6"
    ]


def test_aime24_validation_parquet_has_the_dapo_schema(tmp_path):
    frame = pd.read_parquet(vb.write_aime24_parquet(tmp_path / "aime24.parquet"))
    assert len(frame) == 30
    row = frame.iloc[0]
    assert row["data_source"] == "aime24" and row["ability"] == "MATH"
    assert row["prompt"][0]["role"] == "user" and "Answer:" in row["prompt"][0]["content"]
    assert row["reward_model"]["ground_truth"].isdigit()


def test_cli_dry_run_prints_the_command_and_writes_aime24(data, tmp_path):
    from dapo_suite.train.cli import train

    out = tmp_path / "cli-run"
    result = CliRunner().invoke(
        train,
        [
            "--backend",
            "verl",
            "--preset",
            "dapo",
            "--model",
            "Qwen/Qwen2.5-32B",
            "--nnodes",
            "16",
            "--gpus-per-node",
            "8",
            "--train-file",
            str(data / "train.parquet"),
            "--out",
            str(out),
            "--dry-run",
            "--set",
            "verl.trainer.logger=[console]",
        ],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "-m \\\n  verl.trainer.main_ppo" in result.output
    assert "algorithm.filter_groups.metric=acc" in result.output
    assert "trainer.logger=[console]" in result.output
    assert (out / "data" / "aime24.parquet").is_file()
    cfg = OmegaConf.load(out / "verl_config.yaml")
    assert cfg.data.val_files == str(out.resolve() / "data" / "aime24.parquet")
    assert list(cfg.trainer.logger) == ["console"]


def test_cli_bad_input_is_a_usage_error(data, tmp_path):
    from dapo_suite.train.cli import train

    result = CliRunner().invoke(
        train,
        [
            "--backend",
            "verl",
            "--preset",
            "dapo",
            "--model",
            "/nonexistent",
            "--train-file",
            str(data / "train.parquet"),
            "--out",
            str(tmp_path / "r"),
            "--dry-run",
            "--tp",
            "3",
        ],
    )
    assert result.exit_code == 2
    assert "model path '/nonexistent' does not exist" in result.output
    assert "rollout tensor parallel size 3 must divide the GPUs per node that generate (8)" in result.output


def test_a_parquet_without_the_verl_columns_is_rejected(data, tmp_path):
    flat = tmp_path / "flat.parquet"
    pd.DataFrame({"problem": ["What is 1 + 1?"], "answer": ["2"]}).to_parquet(flat)
    config = dataclasses.replace(_config(data, tmp_path), train_file=str(flat))
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    with pytest.raises(
        vb.VerlConfigError, match=r"lacks the verl columns \['data_source', 'prompt', 'reward_model'\]"
    ):
        vb.validate(config, hw, vb.build_overrides(config, hw))


def test_verls_model_patching_runs_in_the_projects_environment(embedded_model_dir):
    """verl builds every actor through `apply_monkey_patch`, which imports trl's
    AutoModelForCausalLMWithValueHead whenever trl is importable; trl 1.x removed it, so with trl in the
    environment verl could build no model. The environment that runs verl (`make test`'s) must let verl's own
    function patch the embedded model."""
    from transformers import AutoModelForCausalLM
    from verl.models.transformers.monkey_patch import apply_monkey_patch

    model = AutoModelForCausalLM.from_pretrained(str(embedded_model_dir), attn_implementation="sdpa")
    apply_monkey_patch(model=model, use_remove_padding=False)


def test_verls_warm_up_gives_the_first_step_a_learning_rate(data, tmp_path):
    """With verl's constant schedule, step 1 ran at lr 0 (a checkpoint bit-identical to the base model). The
    composed config, fed to verl's own scheduler, must give step k the factor k/w and then hold lr."""
    import torch
    from verl.utils.torch_functional import get_cosine_schedule_with_warmup

    config = _config(data, tmp_path, presets=("dapo",))
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
    optim = cfg.actor_rollout_ref.actor.optim
    assert optim.lr_scheduler_type == "cosine" and optim.lr_warmup_steps == config.warmup_steps
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=optim.lr)
    schedule = get_cosine_schedule_with_warmup(
        optimizer,
        optim.lr_warmup_steps,
        config.max_steps,
        min_lr_ratio=optim.min_lr_ratio,
        num_cycles=optim.num_cycles,
        zero_indexed_step=optim.zero_indexed_step,
    )
    rates = []
    for _ in range(config.max_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    warmup = config.warmup_steps
    assert rates[0] == pytest.approx(optim.lr / warmup) and rates[0] > 0
    assert rates[warmup - 1 :] == pytest.approx([optim.lr] * (config.max_steps - warmup + 1))


def test_verls_v1_trainer_can_start_in_the_projects_environment(data, tmp_path):
    """`python -m verl.trainer.main_ppo` runs the V1 trainer (trainer.use_v1), whose task runner imports
    transfer_queue (verl's verl-core extra) before anything else: the product's environment must have it, and
    the trainer class of the composed config must resolve."""
    import transfer_queue
    from verl.trainer.ppo.v1 import get_trainer_cls

    config = _config(data, tmp_path, presets=("dapo",))
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
    assert cfg.trainer.use_v1 is True
    assert callable(transfer_queue.init) and get_trainer_cls(cfg.trainer.v1.trainer_mode) is not None


@pytest.mark.parametrize("mode", ["one_step", "fully"])
def test_async_dapo_composes_for_16x8_with_its_split_filter_and_correction(mode, data, tmp_path):
    """`--set async=one_step|fully` composes verl's own one_step_off_policy / fully_async_policy config for
    the paper's 16 x 8 run: half the nodes generate, half train, DAPO's switches hold, the group filter gets
    its bound, and stale samples are importance-weighted (decoupled mode: verl's bypass mode would replace the
    policy loss)."""
    from dapo_suite.train.verl.group_filter import GroupFilter

    config = _config(data, tmp_path, async_mode=mode)
    plan = vb.dry_run(config, vb.Hardware(nnodes=16, gpus_per_node=8))
    cfg = plan["config"]
    assert (
        cfg.rollout.nnodes,
        cfg.rollout.n_gpus_per_node,
        cfg.trainer.nnodes,
        cfg.trainer.n_gpus_per_node,
    ) == (8, 8, 8, 8)
    assert plan["argv"][2:4] == ["dapo_suite.train.verl.async_entry", mode]
    assert (
        "# GPUs: 128 = generation 8 x 8 = 64 (vLLM TP 4: 16 servers) + training 8 x 8 = 64 (FSDP, Ulysses SP "
        "8: data-parallel 8)" in plan["script"]
    )
    assert cfg.actor_rollout_ref.hybrid_engine is False
    assert cfg.actor_rollout_ref.rollout.calculate_log_probs is True
    correction = cfg.algorithm.rollout_correction
    assert (correction.bypass_mode, correction.rollout_is, correction.rollout_is_threshold) == (
        False,
        "token",
        2.0,
    )
    for key in (
        "actor_rollout_ref.actor.clip_ratio_high",
        "actor_rollout_ref.actor.loss_agg_mode",
        "actor_rollout_ref.actor.policy_loss.loss_mode",
        "algorithm.filter_groups.metric",
        "reward.reward_kwargs.overlong_buffer_cfg.enable",
        "actor_rollout_ref.rollout.n",
    ):
        assert OmegaConf.select(cfg, key) == PAPER_32B[key], key
    # the sync trainer's replay buffer is not what bounds the filter here
    assert "custom_sampler" not in str(plan["overrides"])
    group_filter = GroupFilter.from_config(cfg)
    assert (group_filter.metric, group_filter.budget) == ("acc", 10 * 1536)
    assert group_filter.stop_file == (tmp_path / "run" / "stopped.json").resolve()
    if mode == "fully":
        # one group streamed at a time; one weight sync per dapo-suite step of 512 prompts (16 updates of 32)
        assert (cfg.data.train_batch_size, cfg.data.gen_batch_size) == (0, 1)
        assert cfg.async_training.trigger_parameter_sync_step == 16
        assert cfg.async_training.require_batches == 1
        assert (cfg.async_training.staleness_threshold, cfg.async_training.partial_rollout) == (0.1, True)
        assert cfg.rollout.total_rollout_steps == 200 * 512
    else:
        assert (cfg.data.train_batch_size, cfg.data.gen_batch_size) == (512, 1536)


@pytest.mark.parametrize(
    ("nnodes", "gpus", "rollout", "message"),
    [
        (16, 8, 12, "--rollout-gpus 12: on 16 nodes verl splits by whole nodes, so give a multiple of 8"),
        (
            16,
            8,
            128,
            "--rollout-gpus 128: an async run needs GPUs on both sides, 1 to 127 of the 128 (16 x 8)",
        ),
        (1, 1, None, "--rollout-gpus 0: an async run needs GPUs on both sides"),
    ],
)
def test_async_bad_split_is_a_usage_error_naming_the_flag(nnodes, gpus, rollout, message, data, tmp_path):
    from dapo_suite.train.cli import train

    result = CliRunner().invoke(
        train,
        [
            "--backend",
            "verl",
            "--preset",
            "dapo",
            "--model",
            "Qwen/Qwen2.5-32B",
            "--nnodes",
            str(nnodes),
            "--gpus-per-node",
            str(gpus),
            "--train-file",
            str(data / "train.parquet"),
            "--out",
            str(tmp_path / "r"),
            "--dry-run",
            "--set",
            "async=fully",
            *(["--rollout-gpus", str(rollout)] if rollout else []),
        ],
    )
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def test_async_splits_one_node_and_checks_each_side(data, tmp_path):
    config = _config(data, tmp_path, async_mode="one_step")
    train, rollout = vb.split_gpus(vb.Hardware(nnodes=1, gpus_per_node=8, rollout_gpus=2))
    assert (train.gpus_per_node, rollout.gpus_per_node) == (6, 2)
    hw = vb.Hardware(nnodes=1, gpus_per_node=8, rollout_gpus=4)
    cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
    assert (cfg.rollout.n_gpus_per_node, cfg.trainer.n_gpus_per_node) == (4, 4)
    # the training side's data-parallel arithmetic: 512 x 16 responses over 6 training GPUs does not divide
    hw = vb.Hardware(nnodes=1, gpus_per_node=8, rollout_gpus=2)
    with pytest.raises(vb.VerlConfigError, match="not divisible by the 6 GPUs"):
        vb.validate(config, hw, vb.build_overrides(config, hw))


def test_set_async_names_the_field_and_its_choices():
    from dapo_suite.core.errors import UserError
    from dapo_suite.train.config import parse_override

    assert parse_override("async=fully") == ("async_mode", "fully")
    with pytest.raises(UserError, match="async 'full' must be one of off, one_step, fully"):
        resolve_config([], {"backend": "verl"}, {"async_mode": "full"})
    with pytest.raises(UserError, match="async=one_step runs verl's async trainers: add --backend verl"):
        resolve_config([], {}, {"async_mode": "one_step"})


def test_a_tool_preset_runs_verls_agent_loop_with_the_sandbox_tool(data, tmp_path):
    config = _config(data, tmp_path, presets=("dapo-tool",))
    for nnodes, gpus in ((1, 8), (16, 8)):
        hw = vb.Hardware(nnodes=nnodes, gpus_per_node=gpus)
        cfg, _ = vb.validate(config, hw, vb.build_overrides(config, hw))
        rollout = cfg.actor_rollout_ref.rollout
        assert rollout.multi_turn.enable is True and rollout.agent.default_agent_loop == "dapo_tool_agent"
        loops = OmegaConf.load(rollout.agent.agent_loop_config_path)
        assert [loop.name for loop in loops] == ["dapo_tool_agent"]
        manager = cfg.reward.reward_manager
        assert (manager.source, manager.name) == ("importlib", "ModelTokenRewardManager")
        assert manager.module.path == "pkg://dapo_suite.train.verl.tool_trajectories"
        assert rollout.mode == "async" and cfg.data.return_raw_chat is True
        assert rollout.multi_turn.max_assistant_turns == config.max_assistant_turns == 4
        tools = OmegaConf.load(rollout.multi_turn.tool_config_path).tools
        assert [tool.class_name for tool in tools] == ["dapo_suite.train.verl.sandbox_tool.SandboxTool"]
    assert rollout.multi_turn.format == "python_block"  # the embedded loop's ```python blocks
    # a single-turn preset keeps verl's single-turn loop and no tool
    plain = vb.validate(
        _config(data, tmp_path), vb.Hardware(), vb.build_overrides(_config(data, tmp_path), vb.Hardware())
    )
    assert plain[0].actor_rollout_ref.rollout.agent.default_agent_loop == "single_turn_agent"
    assert plain[0].actor_rollout_ref.rollout.multi_turn.tool_config_path is None
    assert plain[0].reward.reward_manager.name == "dapo"


@pytest.mark.parametrize(
    "passthrough",
    [
        "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent",
        "actor_rollout_ref.rollout.multi_turn.enable=False",
        "data.return_raw_chat=False",
        "actor_rollout_ref.rollout.multi_turn.tool_config_path=null",
        "reward.reward_manager.name=dapo",
    ],
)
def test_a_tool_run_that_verl_would_train_single_turn_is_refused_naming_the_key(passthrough, data, tmp_path):
    config = _config(data, tmp_path, presets=("dapo-tool",))
    hw = vb.Hardware(nnodes=1, gpus_per_node=8)
    with pytest.raises(vb.VerlConfigError) as caught:
        vb.validate(config, hw, vb.build_overrides(config, hw, [passthrough]))
    assert passthrough.split("=")[0] in str(caught.value)


@pytest.mark.parametrize("async_mode", ["off", "one_step", "fully"])
def test_the_retool_preset_composes_for_qwen2_5_32b_instruct_on_16x8(async_mode, data, tmp_path):
    config = _config(data, tmp_path, ("retool",), model="Qwen/Qwen2.5-32B-Instruct", async_mode=async_mode)
    hw = vb.Hardware(nnodes=16, gpus_per_node=8)
    plan = vb.dry_run(config, hw)
    cfg = plan["config"]
    rollout, actor = cfg.actor_rollout_ref.rollout, cfg.actor_rollout_ref.actor
    assert rollout.multi_turn.enable and rollout.multi_turn.max_assistant_turns == 8
    assert rollout.agent.default_agent_loop == "dapo_tool_agent" and rollout.multi_turn.format == "hermes"
    assert (actor.clip_ratio_low, actor.clip_ratio_high, actor.clip_ratio_c) == (0.2, 0.28, 10.0)
    assert actor.optim.lr == 1e-6 and rollout.n == 16 and actor.ppo_mini_batch_size == 64
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length) == (2048, 16384)
    assert cfg.algorithm.adv_estimator == "grpo" and not actor.use_kl_loss
    # the recipe's reward for tool use, read by ModelTokenRewardManager
    reward_kwargs = cfg.reward.reward_kwargs
    assert (reward_kwargs.tool_call_bonus, reward_kwargs.tool_call_bonus_cap) == (0.1, -0.6)
    assert cfg.reward.reward_manager.name == "ModelTokenRewardManager"


def test_the_python_block_format_reads_the_embedded_loop_s_calls_on_verl():
    """verl's agent loop with `multi_turn.format=python_block` (tool_trajectories' parser, in verl's
    ToolParser registry): a turn's last ```python block is a call of the sandbox tool with its code; a turn
    without one calls nothing; the text stays the model's."""
    import asyncio

    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.schemas import OpenAIFunctionToolSchema

    from dapo_suite.inference.models import embedded_model_path
    from dapo_suite.train.verl.keys import PYTHON_TOOL_CONFIG
    from dapo_suite.train.verl.tool_trajectories import PYTHON_BLOCK

    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
    parser = ToolParser.get_tool_parser(PYTHON_BLOCK, tokenizer)
    schema = OpenAIFunctionToolSchema(
        **OmegaConf.to_container(OmegaConf.load(PYTHON_TOOL_CONFIG).tools[0].tool_schema)
    )
    turn = "Let me check.\n```python\nx = 3\n```\nand then\n```python\nprint(237 + 574)\n```\n"
    content, calls = asyncio.run(parser.extract_tool_calls(tokenizer(turn)["input_ids"], [schema]))
    assert content == turn
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("code_interpreter", {"code": "print(237 + 574)\n"})
    ]
    assert asyncio.run(parser.extract_tool_calls(tokenizer("Answer: 811")["input_ids"], [schema]))[1] == []


def test_a_python_block_tool_run_on_verl_asks_for_the_tool_in_its_prompt(tmp_path):
    from dapo_suite.core.prompts import TOOL_INSTRUCTIONS

    config = resolve_config(["dapo-tool"], {"backend": "verl", "out": str(tmp_path / "run")})
    prepared = vb.prepare(config)
    prompts = pd.read_parquet(prepared.train_file)["prompt"]
    assert all(TOOL_INSTRUCTIONS in turns[-1]["content"] for turns in prompts)
    text = vb.prepare(resolve_config(["dapo"], {"backend": "verl", "out": str(tmp_path / "text")}))
    assert not any(
        TOOL_INSTRUCTIONS in turns[-1]["content"] for turns in pd.read_parquet(text.train_file)["prompt"]
    )


def test_verl_builds_the_sandbox_tool_from_the_shipped_config_and_runs_a_call(tmp_path):
    """The tool config as verl's agent loop loads it (`load_all_tools`): one `code_interpreter` tool whose
    execute runs the code in the sandbox and returns what it printed, with the call's outcome."""
    import asyncio

    from verl.tools.tool_registry import load_all_tools

    from dapo_suite.core.sandbox import isolation
    from dapo_suite.train.verl.keys import PYTHON_TOOL_CONFIG

    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    (tool,) = load_all_tools(tool_config_path=str(PYTHON_TOOL_CONFIG), function_tool_path=None)
    assert tool.name == "code_interpreter"

    async def calls():
        instance, _ = await tool.create()
        shown, reward, metrics = await tool.execute(instance, {"code": "print(237 + 574)"})
        failed, _, failure = await tool.execute(instance, {"code": "1 / 0"})
        bad, _, malformed = await tool.execute(instance, {"program": "print(1)"})
        await tool.release(instance)
        return (shown, reward, metrics), (failed, failure), (bad, malformed)

    (shown, reward, metrics), (failed, failure), (bad, malformed) = asyncio.run(calls())
    assert shown.text.strip() == "811" and reward == 0.0 and metrics["outcome"] == "ok"
    assert "ZeroDivisionError" in failed.text and failure["outcome"] != "ok"
    assert "needs a `code` string" in bad.text and malformed["outcome"] == "bad_call"


def test_on_verl_the_tool_s_output_continues_the_model_s_turn_as_the_embedded_loop_writes_it():
    """DAPOToolAgentLoop's tool state with the python_block format, the embedded tokenizer and the shipped
    sandbox tool: the tool's output follows the model's block as an ```output block in the same turn (the
    embedded loop's tool_turn_text, no chat-template `tool` turn), masked 0, its log-probs 0; a model text
    that already ends with the stop fence gets no second one; at the response budget the turn is cut and
    the trajectory ends."""
    import asyncio

    from transformers import AutoTokenizer
    from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState
    from verl.experimental.agent_loop.tool_parser import ToolParser
    from verl.tools.tool_registry import load_all_tools

    from dapo_suite.core.sandbox import isolation
    from dapo_suite.inference.models import embedded_model_path
    from dapo_suite.inference.tool_loop import tool_turn_text
    from dapo_suite.train.verl.keys import PYTHON_TOOL_CONFIG
    from dapo_suite.train.verl.tool_trajectories import PYTHON_BLOCK, DAPOToolAgentLoop

    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
    (tool,) = load_all_tools(tool_config_path=str(PYTHON_TOOL_CONFIG), function_tool_path=None)
    loop = object.__new__(DAPOToolAgentLoop)  # the state handler alone: no rollout server
    loop.tokenizer, loop.tool_parser_name, loop.tools = tokenizer, PYTHON_BLOCK, {tool.name: tool}
    loop.max_tool_response_length, loop.tool_response_truncate_side = 256, "middle"
    parser = ToolParser.get_tool_parser(PYTHON_BLOCK, tokenizer)

    def after(model_text: str, response_length: int = 128):
        model = tokenizer.encode(model_text, add_special_tokens=False)
        data = AgentData([], None, None, None, None, {}, "r", {})
        data.prompt_ids, data.response_ids = [7, 8, *model], model
        data.response_mask, data.response_logprobs = [1] * len(model), [-0.5] * len(model)
        _, data.tool_calls = asyncio.run(parser.extract_tool_calls(model, [tool.tool_schema]))
        loop.response_length = response_length
        state = asyncio.run(loop._handle_processing_tools_state(data))
        tool_ids = data.prompt_ids[2 + len(model) :]
        assert data.response_mask == [1] * len(model) + [0] * len(tool_ids)
        assert data.response_logprobs == [-0.5] * len(model) + [0.0] * len(tool_ids)
        return state, tokenizer.decode(tool_ids), data.user_turns

    block = "Mia has\n```python\nprint(846 + 619)\n```\n"
    state, turn, turns = after(block)
    assert (state, turn, turns) == (AgentState.GENERATING, tool_turn_text("1465", True), 1)
    assert "<|im_start|>" not in turn
    assert after(block + "```output")[1] == "\n1465\n```\n"  # vLLM kept the stop string's tokens
    state, turn, _ = after(block, response_length=len(tokenizer.encode(block)) + 3)
    assert state == AgentState.TERMINATED and len(tokenizer.encode(turn, add_special_tokens=False)) == 3


def test_float_keys_that_verl_s_yaml_writes_as_integers_take_fractions(data, tmp_path):
    """rollout.top_p is `1` in verl's YAML and a float in its RolloutConfig: 0.7 is valid (the tool preset's),
    where an integer-typed key (LoRA's alpha) still refuses a fraction (the error table above)."""
    config = _config(data, tmp_path, top_p=0.7)
    cfg, _ = vb.validate(config, vb.Hardware(), vb.build_overrides(config, vb.Hardware()))
    assert cfg.actor_rollout_ref.rollout.top_p == 0.7
