"""Helpers shared by the data-pipeline tests (imported by tests/test_data_*.py; not a conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from data_pipeline.sources import default_data_root


def shared_data_dir() -> Path:
    """The raw data folder (PROVENANCE.md), or skip: these tests need the project's shared/data."""
    root = default_data_root()
    if not (root / "math_train" / "train.jsonl").is_file():
        pytest.skip(f"raw data not found at {root}: set $DAPO_SUITE_DATA to the project's shared/data folder")
    return root
