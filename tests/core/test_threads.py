"""The sampler's threads: the cores other programs leave free (dapo_suite/core/threads.py), with a real
neighbour."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from dapo_suite.core import threads
from dapo_suite.core.threads import FreeCores, busy_seconds, fixed_threads, threads_for


@pytest.mark.parametrize(
    ("cores", "others", "expected"),
    [(2, 0.0, 2), (2, 0.2, 2), (2, 0.4, 1), (2, 1.0, 1), (2, 1.9, 1), (4, 1.0, 3), (4, 1.5, 2), (1, 3.0, 1)],
)
def test_each_core_others_keep_a_third_busy_is_left_to_them_down_to_one_thread(cores, others, expected):
    assert threads_for(cores, others) == expected


def test_busy_seconds_reads_the_busy_ticks_of_the_given_cores_from_proc_stat(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (guest fields after them are inside user already)
    stat.write_text(
        "cpu  300 0 100 900 50 0 0 0 0 0\ncpu0 100 0 50 400 20 0 0 10 0 0\ncpu1 200 0 50 500 30 0 0 0 0 "
        "0\nintr 12345\n"
    )
    hz = os.sysconf("SC_CLK_TCK")
    assert busy_seconds({0}, stat) == pytest.approx(160 / hz)
    assert busy_seconds({0, 1}, stat) == pytest.approx(410 / hz)
    assert busy_seconds({0}, tmp_path / "missing") is None


def test_a_thread_count_the_user_set_is_kept(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.THREADS_VARIABLE, raising=False)
    assert fixed_threads() is None
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert fixed_threads() == 3
    monkeypatch.setenv(threads.THREADS_VARIABLE, "1")
    assert fixed_threads() == 1
    before = torch.get_num_threads()
    with FreeCores().sampling() as cores:
        assert cores is None and torch.get_num_threads() == before


@pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores: a neighbour on 1 core leaves 1 thread"
)
def test_a_busy_neighbour_takes_a_core_and_the_thread_count_is_restored_after_the_block(monkeypatch):
    """A real neighbour (a Python busy loop) beside a sampling block: within a few readings the block runs on
    fewer threads than the cores; after the block torch's count is what it was."""
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv(threads.THREADS_VARIABLE, raising=False)
    monkeypatch.setattr(threads, "CHECK_SECONDS", 0.2)
    cores = FreeCores()
    before = torch.get_num_threads()
    torch.set_num_threads(len(cores.cores))
    neighbour = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        seen = []
        with cores.sampling() as watch:
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                watch.adapt()
                seen.append(torch.get_num_threads())
                sum(i * i for i in range(20_000))  # this process's own work between two steps
        assert min(seen) < len(cores.cores), seen
        assert torch.get_num_threads() == len(cores.cores)
    finally:
        neighbour.kill()
        neighbour.wait()
        torch.set_num_threads(before)
