"""Clusters without a shared disk: `ray job submit` ships the dapo_suite package with the job (Ray's
runtime_env `py_modules`), and verl finds the reward by module (`pkg://`), not by a path on the driver's disk.
A real local Ray head on 127.0.0.1 runs a job submitted from a copy of the package in another folder; the job
loads the reward and the overlong-filter extension through verl's own loaders, from the shipped copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dapo_suite.core.ports import free_port

RAY = str(Path(sys.executable).with_name("ray"))
JOB = """
import sys
# as on a node where dapo-suite is not installed: drop this machine's editable install of it
sys.meta_path[:] = [
    finder for finder in sys.meta_path if "__editable__" not in getattr(finder, "__module__", "")
]
import dapo_suite, dapo_suite.shipped_marker
from verl.utils.import_utils import import_external_libs, load_extern_object
from dapo_suite.train.verl.keys import EXTENSION_MODULE, PAPER_CONSTANTS
path = dict(PAPER_CONSTANTS)["reward.custom_reward_function.path"]
score = load_extern_object(module_path=path, object_name="compute_score")
import_external_libs(EXTENSION_MODULE)
from verl.trainer.ppo.core_algos import get_policy_loss_fn
get_policy_loss_fn("dapo_overlong_filter")
print("JOB", dapo_suite.__file__, float(score("math_dapo", "Answer: 7", "7")["acc"]))
"""


@pytest.fixture
def ray_head():
    temp = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))  # short: Ray's socket paths must fit in 107 bytes
    port, dashboard = free_port(), free_port()
    # the cluster's `python` is this environment's (it has verl); the head runs away from the checkout, whose
    # folder would otherwise be the job's working directory and put the checkout's dapo_suite first
    # HOME of its own: a ~/.ray/auth_token left by an earlier local Ray (verl's CPU runs start one) makes the
    # head require a token that `ray job submit` does not send
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "HOME": str(temp),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    }
    started = subprocess.run(
        [
            RAY,
            "start",
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={port}",
            f"--dashboard-port={dashboard}",
            "--dashboard-host=127.0.0.1",
            "--num-cpus=1",
            "--include-dashboard=true",
            f"--temp-dir={temp}",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        cwd=temp,
    )
    assert started.returncode == 0, started.stderr[-2000:]
    try:
        yield f"http://127.0.0.1:{dashboard}", env
    finally:
        subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120, env=env)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.slow
def test_a_job_submitted_from_another_folder_runs_the_shipped_package(ray_head, tmp_path):
    address, ray_env = ray_head
    clone = tmp_path / "elsewhere"
    shutil.copytree(
        Path(__file__).resolve().parents[3] / "dapo_suite",
        clone / "dapo_suite",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    (clone / "dapo_suite" / "shipped_marker.py").write_text("SHIPPED = True\n")
    # the runtime_env as the copy computes it: its own package folder, nothing of the checkout
    runtime_env = json.loads(
        subprocess.run(
            [
                sys.executable,
                "-c",
                "import json; from dapo_suite.train.verl.launch import job_runtime_env; "
                "print(json.dumps(job_runtime_env()))",
            ],
            cwd=clone,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONPATH": str(clone)},
        ).stdout
    )
    assert runtime_env == {"py_modules": [str(clone / "dapo_suite")]}
    submit = subprocess.run(
        [
            RAY,
            "job",
            "submit",
            "--address",
            address,
            "--runtime-env-json",
            json.dumps(runtime_env),
            "--",
            "python",
            "-c",
            JOB,
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env=ray_env,
    )
    assert submit.returncode == 0, (submit.stdout + submit.stderr)[-3000:]
    line = next(line for line in submit.stdout.splitlines() if line.startswith("JOB "))
    _, shipped_file, acc = line.split()
    assert "runtime_resources" in shipped_file and str(clone) not in shipped_file
    assert float(acc) == 1.0
