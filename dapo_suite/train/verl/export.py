"""`dapo-suite train export`: find the newest verl FSDP actor checkpoint and merge it with verl's model merger."""

from __future__ import annotations

import sys
from pathlib import Path


def latest_actor_dir(run_dir: Path) -> Path:
    """RUN_DIR/checkpoints/global_step_N/actor of the newest step (verl's layout; also accepts the dir itself)."""
    run_dir = Path(run_dir)
    if (run_dir / "fsdp_config.json").is_file():
        return run_dir
    root = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    marker = root / "latest_checkpointed_iteration.txt"
    if marker.is_file():
        step_dir = root / f"global_step_{marker.read_text().strip()}"
    else:
        steps = sorted(root.glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1]))
        if not steps:
            raise FileNotFoundError(f"no verl checkpoint under {root} (expected global_step_N/actor)")
        step_dir = steps[-1]
    actor = step_dir / "actor"
    if not (actor / "fsdp_config.json").is_file():
        raise FileNotFoundError(f"{actor} is not an FSDP actor checkpoint (no fsdp_config.json)")
    return actor


def export_command(actor_dir: Path, target_dir: Path) -> list[str]:
    return [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp", "--local_dir", str(actor_dir),
            "--target_dir", str(target_dir)]
