"""The toy training scale and the CLI runner shared by the end-to-end tests (a module, not a conftest: the tests
import what they use)."""

from __future__ import annotations

import subprocess
import sys

# Toy training scale: seconds per step on a CPU.
TOY = {"group_size": 2, "gen_batch_size": 2, "train_batch_size": 2, "mini_batch_size": 1, "micro_batch_size": 4,
       "max_response_length": 8, "overlong_buffer_len": 4, "heldout_size": 4, "val_n": 1, "max_num_gen_batches": 1}
TOY_FLAGS = [arg for key, value in TOY.items() for arg in ("--set", f"{key}={value}")]


def dapo_suite(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`dapo-suite ARGS...` in a fresh interpreter, output captured."""
    return subprocess.run([sys.executable, "-m", "dapo_suite.cli", *args], capture_output=True, text=True,
                          timeout=timeout)
