"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

# OpenMP threads that wait for work sleep instead of spinning, for the peers and the test process, not the
# product: beside a training run, the endpoint's tests took 406-461 s with spinning threads against 172-176 s
# without, mostly in those running `transformers serve` (one: 109 s against 20 s); the sampler's own took
# 131-134 s against 110 s, as it leaves busy cores alone (dapo_suite/core/threads.py).
# docs/results/serve/omp-wait-policy-ab.txt. Set before torch loads its OpenMP runtime; the subprocesses the
# tests start inherit it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def raw_data_dir() -> Path:
    """The raw public data (AIME, AMC, MATH, GSM8K, DAPO-Math-17k; docs/data.md), found where the product
    finds it ($DAPO_SUITE_DATA, else the per-user cache); the one way tests reach it. Skips when it is
    absent."""
    from data_pipeline.sources import NAMED_SOURCES, default_data_root

    root = default_data_root()
    missing = [name for name, path in NAMED_SOURCES.items() if not (root / path).is_file()]
    if missing:
        pytest.skip(
            f"raw data not found at {root} (missing {', '.join(missing)}): set DAPO_SUITE_DATA to the "
            f"folder that holds it (docs/data.md)"
        )
    return root


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors directory (converted once, then cached)."""
    from dapo_suite.inference.models import embedded_model_path

    return embedded_model_path()


@pytest.fixture(scope="module", autouse=True)
def module_folders_removed_when_it_passes(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
):
    """A module fixture's folder (a trained run: 1.6 GB of checkpoints) is removed when its module's tests all
    passed, not kept to the session's end: summed over the suite they filled CI's disk. A failed module keeps
    its folders, as pytest keeps a failed test's (tmp_path_retention_policy)."""
    import shutil

    base = tmp_path_factory.getbasetemp()
    before = set(base.iterdir())
    failed_before = request.session.testsfailed
    yield
    if request.session.testsfailed == failed_before:
        for path in set(base.iterdir()) - before:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)


# CI's deadline (.ci/run sets it: its start plus the budget for this CPU, docs/architecture.md "CI"). A test
# marked `budgeted` runs only if its `launches(N)` fit before the deadline at the pace of the launches this
# process has measured so far: checks that extend a cheaper one run where time allows, and are named as
# skipped where not.
DEADLINE_ENV = "DAPO_SUITE_TEST_DEADLINE"
_launches: dict[str, int] = {}  # nodeid -> launches of a test being run
_setup_seconds: dict[str, float] = {}
_seconds_per_launch: list[float] = []


def pytest_runtest_setup(item: pytest.Item) -> None:
    import time

    marker = item.get_closest_marker("launches")
    if marker is None:
        return
    deadline = os.environ.get(DEADLINE_ENV)
    if deadline and item.get_closest_marker("budgeted") and _seconds_per_launch:
        need = marker.args[0] * max(_seconds_per_launch)
        left = float(deadline) - time.time()
        if need > left:
            pytest.skip(
                f"{item.name} over CI's budget: needs about {need:.0f} s, {max(left, 0):.0f} s left "
                f"(it runs in `make test-scale` outside CI)"
            )
    _launches[item.nodeid] = marker.args[0]  # only a test that runs is timed


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.nodeid not in _launches:
        return
    if report.when == "setup":  # a module fixture's launch is paid in the setup of the first test using it
        _setup_seconds[report.nodeid] = report.duration
    elif report.when == "call" and report.passed:
        seconds = _setup_seconds.pop(report.nodeid, 0.0) + report.duration
        _seconds_per_launch.append(seconds / _launches.pop(report.nodeid))
