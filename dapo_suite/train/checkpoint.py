"""Checkpoints in Hugging Face format, written atomically, with the trainer state needed to resume.

`RUN/checkpoints/step-000012/` holds `model.safetensors`, `config.json`, the tokenizer and its chat template
(so `from_pretrained`, `dapo-suite eval` and `dapo-suite serve` take it as is) and `trainer_state.pt`
(optimizer, scheduler, RNG, data cursor, reused groups). It is written to a hidden temporary folder and renamed
into place, so a crash mid-write leaves the previous checkpoint intact; `RUN/checkpoint-last` names the newest.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch

LAST = "checkpoint-last"


def checkpoint_dir(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, trainer_state: dict, keep: int = 1) -> Path:
    root = checkpoint_dir(run_dir)
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step:06d}"
    staging = root / f".step-{step:06d}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer.save_pretrained(staging)
    torch.save(trainer_state, staging / "trainer_state.pt")
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    _point_last(run_dir, final)
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return final


def _point_last(run_dir: Path, target: Path) -> None:
    link = Path(run_dir) / LAST
    temporary = Path(run_dir) / f".{LAST}.tmp"
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    temporary.symlink_to(target.relative_to(run_dir))
    os.replace(temporary, link)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (partial writes are ignored), or None."""
    complete = [p for p in sorted(checkpoint_dir(run_dir).glob("step-*")) if (p / "trainer_state.pt").is_file()]
    return complete[-1] if complete else None


def load_trainer_state(checkpoint: Path) -> dict:
    # Our own file (optimizer tensors, RNG states, Rollout records): not loadable with weights_only.
    return torch.load(checkpoint / "trainer_state.pt", weights_only=False)
