"""Every run directory records the package version and git revision (`dapo_suite.core.provenance`), and a
saved config stays readable as input."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from dapo_suite import __version__
from dapo_suite.core.provenance import provenance
from dapo_suite.train.config import TrainConfig, load_preset
from data_pipeline.config import BuildConfig


def test_provenance_gives_the_version_and_a_revision_or_none():
    record = provenance()
    assert set(record) == {"version", "git_rev", "machine", "torch_threads", "accelerator"}
    assert record["version"] == __version__
    assert record["git_rev"] is None or re.fullmatch("[0-9a-f]{40}", record["git_rev"])
    assert re.search(r", \d+ cores, flags ", record["machine"])
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "cpu family" in cpuinfo.read_text():  # an x86 Linux: the CPU generation is named
        assert re.search(r" \(family \d+ model \d+\), ", record["machine"])


def test_the_torch_thread_count_is_recorded_once_torch_is_loaded():
    # A process that loads torch (train, eval) records the thread count its reductions ran with.
    import torch

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert provenance()["torch_threads"] == 1
    finally:
        torch.set_num_threads(threads)  # the tests after this one run as before


def test_no_git_gives_no_revision(monkeypatch):
    def missing_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", missing_git)
    assert provenance()["git_rev"] is None and provenance()["version"] == __version__


def test_saved_configs_carry_provenance_and_read_back(tmp_path):
    config = TrainConfig(seed=3)
    config.save(tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert f"version: {__version__}\n" in text and "git_rev:" in text
    assert load_preset(str(tmp_path / "config.yaml"))["seed"] == 3

    build = BuildConfig(out=str(tmp_path / "data"), limit=7)
    (tmp_path / "config.json").write_text(json.dumps({**build.to_dict(), **provenance()}))
    assert BuildConfig.from_sources(tmp_path / "config.json") == build
