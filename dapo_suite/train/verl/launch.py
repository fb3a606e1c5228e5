"""Dry run and launch: validate, write the run directory, then start verl (local Ray or `ray job submit`)."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from dapo_suite.train.config import TrainConfig
from dapo_suite.train.verl.data import prepare
from dapo_suite.train.verl.keys import PACKAGE_DIR, REPO_ROOT, Hardware, build_overrides, hydra_value
from dapo_suite.train.verl.validate import validate

ENTRY_POINT = [sys.executable, "-m", "verl.trainer.main_ppo"]


def command(overrides: list[str], hw: Hardware, run_dir: Path | None = None) -> list[str]:
    """The argv that starts the run: in-process local Ray, or `ray job submit` to `hw.ray_address`.

    Hydra's own log goes to RUN_DIR/hydra instead of ./outputs/DATE (not part of the validated overrides)."""
    if run_dir is not None:
        overrides = [*overrides, f"hydra.run.dir={hydra_value(str(Path(run_dir).resolve() / 'hydra'))}"]
    if hw.ray_address is None:
        return [*ENTRY_POINT, *overrides]
    return ["ray", "job", "submit", "--address", hw.ray_address, "--runtime-env-json",
            json.dumps(job_runtime_env()), "--", "python", "-m", "verl.trainer.main_ppo", *overrides]


def job_runtime_env() -> dict[str, Any]:
    """What `ray job submit` sends with the job: the dapo_suite package itself (`py_modules`: Ray uploads it from
    this machine and unpacks it on every node), so a cluster without a shared disk runs the same code; nothing
    points at this machine's checkout."""
    return {"py_modules": [str(PACKAGE_DIR)]}



def dry_run(config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """Validate and write RUN_DIR/{config.yaml, verl_config.yaml, verl_command.sh}; start nothing."""
    from omegaconf import OmegaConf

    config = prepare(config)
    overrides = build_overrides(config, hw, passthrough)
    cfg, notes = validate(config, hw, overrides)
    run_dir = Path(config.out)
    argv = command(overrides, hw, run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    config.save(run_dir / "config.yaml")
    (run_dir / "verl_config.yaml").write_text(OmegaConf.to_yaml(cfg))
    env = f"PYTHONPATH={shlex.quote(str(REPO_ROOT))}"
    script = f"#!/usr/bin/env bash\n{env} \\\n  " + " \\\n  ".join(shlex.quote(a) for a in argv) + "\n"
    (run_dir / "verl_command.sh").write_text(script)
    return {"argv": argv, "overrides": overrides, "config": cfg, "warnings": notes, "run_dir": run_dir,
            "script": script}


def launch(config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()) -> int:
    """Validate, write the run directory like `dry_run`, then run verl in the foreground; returns its exit code."""
    import subprocess

    plan = dry_run(config, hw, passthrough)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.call(plan["argv"], env=env)

