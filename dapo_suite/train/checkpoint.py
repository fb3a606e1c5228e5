"""Checkpoints in Hugging Face format, written atomically, with the trainer state needed to resume.

`RUN/checkpoints/step-000012/` holds `model.safetensors`, `config.json`, the tokenizer and its chat template
(so `from_pretrained`, `dapo-suite eval` and `dapo-suite serve` take it as is) and `trainer_state.pt`
(optimizer, scheduler, RNG, data cursor, reused groups). A LoRA run's holds the adapter folder instead of the
weights (`adapter_config.json`, `adapter_model.safetensors`: eval and serve load it over its base model), and
its optimizer state covers the adapters only. `export_checkpoint` writes either as one plain Hugging Face
folder. It is written to a hidden temporary folder and renamed into place, so a crash mid-write leaves the
previous checkpoint intact; `RUN/checkpoint-last` names the newest.

`checksums.json` records the SHA-256 and size of every file, and `--resume` checks them before loading, then
checks that no weight or optimizer tensor holds NaN or Inf: a damaged checkpoint (a flipped bit, a truncated
file, a diverged step saved by an older version) stops the run with the file named, instead of training on.
The default `keep_checkpoints: 2` keeps the one before it to resume from.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import torch

from dapo_suite.core.errors import UserError

LAST = "checkpoint-last"
CHECKSUMS = "checksums.json"


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
    _write_checksums(staging)
    if final.exists():
        shutil.rmtree(final)
    os.replace(staging, final)
    _point_last(run_dir, final)
    for old in sorted(root.glob("step-*"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return final


def export_checkpoint(checkpoint: Path, target: Path) -> Path:
    """`checkpoint` as a plain Hugging Face folder at `target`: a LoRA checkpoint's adapters merged into its
    base model, a full checkpoint's weights, config and tokenizer copied (its trainer state left behind)."""
    from dapo_suite.inference.models import is_adapter_folder, merge_adapters

    target = Path(target)
    staging = target.parent / f".{target.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    if is_adapter_folder(checkpoint):
        merge_adapters(checkpoint, staging)
    else:
        shutil.copytree(checkpoint, staging, ignore=shutil.ignore_patterns("trainer_state.pt", CHECKSUMS))
    if target.exists():
        shutil.rmtree(target)
    os.replace(staging, target)
    return target


def _point_last(run_dir: Path, target: Path) -> None:
    link = Path(run_dir) / LAST
    temporary = Path(run_dir) / f".{LAST}.tmp"
    if temporary.is_symlink() or temporary.exists():
        temporary.unlink()
    temporary.symlink_to(target.relative_to(run_dir))
    os.replace(temporary, link)


def remove_checkpoints(run_dir: Path) -> int:
    """Delete a run's checkpoints and its `checkpoint-last` link (its metrics, summary and config stay);
    returns the bytes freed."""
    root, link = checkpoint_dir(run_dir), Path(run_dir) / LAST
    freed = sum(path.stat().st_size for path in root.rglob("*") if path.is_file()) if root.is_dir() else 0
    shutil.rmtree(root, ignore_errors=True)
    if link.is_symlink():
        link.unlink()
    return freed


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (partial writes are ignored), or None."""
    complete = [
        p for p in sorted(checkpoint_dir(run_dir).glob("step-*")) if (p / "trainer_state.pt").is_file()
    ]
    return complete[-1] if complete else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()


def _write_checksums(folder: Path) -> None:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    (folder / CHECKSUMS).write_text(
        json.dumps({p.name: {"sha256": _sha256(p), "bytes": p.stat().st_size} for p in files}, indent=1)
    )


def _damaged(checkpoint: Path, what: str) -> UserError:
    earlier = [p.name for p in sorted(checkpoint.parent.glob("step-*")) if p.name < checkpoint.name]
    fallback = (
        f"the previous checkpoint, {earlier[-1]}, is kept: move {checkpoint.name} out of "
        f"{checkpoint.parent} and rerun with --resume to continue from it"
        if earlier
        else "no earlier checkpoint is kept: start again with a new --out (or raise keep_checkpoints)"
    )
    return UserError(f"--resume: checkpoint {checkpoint} is damaged: {what}. Not loaded; {fallback}.")


def verify_checkpoint(checkpoint: Path) -> None:
    """Every file's size and SHA-256 against checksums.json (checkpoints written before it existed pass)."""
    listing = checkpoint / CHECKSUMS
    if not listing.is_file():
        return
    for name, expected in json.loads(listing.read_text()).items():
        path = checkpoint / name
        if not path.is_file():
            raise _damaged(checkpoint, f"{path} is missing")
        if path.stat().st_size != expected["bytes"]:
            raise _damaged(
                checkpoint, f"{path} has {path.stat().st_size} bytes, {expected['bytes']} were written"
            )
        if _sha256(path) != expected["sha256"]:
            raise _damaged(checkpoint, f"{path} does not match the SHA-256 recorded when it was written")


def require_finite(checkpoint: Path, file: str, tensors: dict) -> None:
    """Stop on the first tensor with NaN or Inf; `tensors` maps names to tensors (nested dicts and lists
    too)."""
    stack = list(tensors.items())
    while stack:
        name, value = stack.pop()
        if isinstance(value, dict):
            stack += [(f"{name}.{key}", item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            stack += [(f"{name}.{index}", item) for index, item in enumerate(value)]
        elif torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
            bad = int((~torch.isfinite(value)).sum())
            raise _damaged(checkpoint, f"{checkpoint / file}: {name} holds {bad} NaN or Inf values")


def load_trainer_state(checkpoint: Path) -> dict:
    # Our own file (optimizer tensors, RNG states, Rollout records): not loadable with weights_only.
    path = checkpoint / "trainer_state.pt"
    try:
        state = torch.load(path, weights_only=False)
    except (
        OSError,
        RuntimeError,
        EOFError,
        ValueError,
    ) as error:  # torch's errors for a truncated zip/pickle
        raise _damaged(checkpoint, f"{path} cannot be read ({error})") from None
    require_finite(checkpoint, "trainer_state.pt", {"optimizer": state["optimizer"]["state"]})
    return state
