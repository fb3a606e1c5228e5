"""Fixtures shared by the whole suite."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The raw public data beside the checkout (`../shared/data`, or $DAPO_SUITE_DATA); skips when absent."""
    root = Path(os.environ.get("DAPO_SUITE_DATA", REPO_ROOT.parent / "shared" / "data"))
    if not (root / "PROVENANCE.md").is_file():
        pytest.skip(f"shared data not found at {root}: set DAPO_SUITE_DATA to the folder holding PROVENANCE.md")
    return root


@pytest.fixture(scope="session")
def embedded_model_dir() -> Path:
    """The embedded SmolLM2-135M-Instruct as a safetensors directory (converted once, then cached)."""
    from dapo_suite.inference.models import embedded_model_path

    return embedded_model_path()
