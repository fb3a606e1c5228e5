"""CI's budget (tests/conftest.py, .ci/run): a test marked `budgeted` runs only if its launches fit before the
deadline at the pace measured on the launches before it, and says so when it is skipped. A real pytest session
in a folder of its own, with the suite's conftest; the 'launches' are sleeps."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

INNER = """
import time
import pytest

@pytest.mark.launches(1)
def test_first():
    time.sleep(1.5)

@pytest.mark.budgeted
@pytest.mark.launches(2)
def test_extends_it():
    pass
"""


def run_session(tmp_path: Path, deadline_in_s: float | None) -> str:
    (tmp_path / "conftest.py").write_text((TESTS / "conftest.py").read_text())
    (tmp_path / "test_inner.py").write_text(INNER)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    launches(n): n\n    budgeted: b\n")
    env = {key: value for key, value in os.environ.items() if key != "DAPO_SUITE_TEST_DEADLINE"}
    if deadline_in_s is not None:
        env["DAPO_SUITE_TEST_DEADLINE"] = str(time.time() + deadline_in_s)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "test_inner.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def test_a_budgeted_test_that_does_not_fit_is_skipped_with_what_it_needs(tmp_path):
    # two launches at the measured 1.5 s each need about 3 s; 2 s are left after the first test
    output = run_session(tmp_path, deadline_in_s=3.5)
    assert "1 passed, 1 skipped" in output
    assert "test_extends_it over CI's budget: needs about 3 s" in output and "make test-scale" in output


def test_a_budgeted_test_that_fits_runs(tmp_path):
    assert "2 passed" in run_session(tmp_path, deadline_in_s=60)


def test_without_a_deadline_every_test_runs(tmp_path):
    assert "2 passed" in run_session(tmp_path, deadline_in_s=None)
