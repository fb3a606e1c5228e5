"""`dapo-suite train export`: find the newest verl FSDP actor checkpoint and merge it with verl's model
merger.

verl's merger writes bfloat16 whatever the shards hold (verl trains with float32 master weights):
`export_dtypes` reads what was written, so the command says it and records it in `EXPORT_RECORD` beside the
weights.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

EXPORT_RECORD = "dapo_suite_export.json"


def checkpointed_step(root: Path) -> int | None:
    """The newest complete step of a verl checkpoint folder (ROOT/global_step_N): verl's marker, which it
    writes last, else the highest N; None when there is none."""
    marker = Path(root) / "latest_checkpointed_iteration.txt"
    if marker.is_file():
        return int(marker.read_text().strip())
    steps = [int(p.name.rsplit("_", 1)[1]) for p in Path(root).glob("global_step_*")]
    return max(steps) if steps else None


def latest_actor_dir(run_dir: Path) -> Path:
    """RUN_DIR/checkpoints/global_step_N/actor of the newest step (verl's layout; also accepts the dir
    itself)."""
    run_dir = Path(run_dir)
    if (run_dir / "fsdp_config.json").is_file():
        return run_dir
    root = run_dir / "checkpoints" if (run_dir / "checkpoints").is_dir() else run_dir
    step = checkpointed_step(root)
    if step is None:
        raise FileNotFoundError(f"no verl checkpoint under {root} (expected global_step_N/actor)")
    actor = root / f"global_step_{step}" / "actor"
    if not (actor / "fsdp_config.json").is_file():
        raise FileNotFoundError(f"{actor} is not an FSDP actor checkpoint (no fsdp_config.json)")
    return actor


def export_command(actor_dir: Path, target_dir: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "verl.model_merger",
        "merge",
        "--backend",
        "fsdp",
        "--local_dir",
        str(actor_dir),
        "--target_dir",
        str(target_dir),
    ]


def export_dtypes(target_dir: Path) -> dict[str, int]:
    """{dtype: tensor count} of the safetensors files in an exported folder, read from their headers only."""
    counts: Counter[str] = Counter()
    for path in sorted(Path(target_dir).glob("*.safetensors")):
        with open(path, "rb") as handle:
            size = int.from_bytes(handle.read(8), "little")
            header = json.loads(handle.read(size))
        counts.update(entry["dtype"] for name, entry in header.items() if name != "__metadata__")
    return dict(counts)


def record_export(actor_dir: Path, target_dir: Path) -> str:
    """Write EXPORT_RECORD (source checkpoint, merger, dtypes written) and return the sentence that says
    it."""
    dtypes = export_dtypes(target_dir)
    step_dir = Path(actor_dir).parent.name  # global_step_N
    step = int(step_dir.rsplit("_", 1)[1]) if step_dir.startswith("global_step_") else None
    (Path(target_dir) / EXPORT_RECORD).write_text(
        json.dumps(
            {"source": str(actor_dir), "step": step, "merger": "verl.model_merger (fsdp)", "dtypes": dtypes},
            indent=1,
        )
    )
    written = ", ".join(f"{count} tensors in {dtype}" for dtype, count in sorted(dtypes.items()))
    return (
        f"exported {written}: verl's model merger writes bfloat16 (the FSDP shards keep the trainer's "
        f"float32 master weights; load them with verl to keep that precision)"
    )
