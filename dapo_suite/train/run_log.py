"""Per-step metrics to `metrics.jsonl` (one JSON object per step), TensorBoard, and W&B when configured.

Metric names (the glossary is in docs/train.md): `reward/` (mean, acc, format_rate), `actor/` (entropy, clip
fractions, ppo_kl, grad_norm, lr), `response_len/` (mean, max, clip_ratio = truncated fraction), `sampling/`
(generation batches, groups kept/all-correct/all-wrong/reused), `perf/` (tokens/s, step seconds), `val/`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path


class MetricsLogger:
    def __init__(self, run_dir: Path, config, truncate_after_step: int | None = None) -> None:
        self.path = Path(run_dir) / "metrics.jsonl"
        if truncate_after_step is not None and self.path.is_file():
            # After a resume, drop what the lost step(s) logged so every step appears once.
            kept = [
                line
                for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line)["step"] <= truncate_after_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept))
        self.tensorboard = None
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tensorboard = SummaryWriter(str(Path(run_dir) / "tensorboard"))
        except ImportError:
            pass
        self.wandb = None
        if getattr(config, "wandb_project", None):
            import wandb

            self.wandb = wandb.init(project=config.wandb_project, config=config.to_dict(), dir=str(run_dir))

    def log(self, step: int, metrics: dict[str, float]) -> None:
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        if self.tensorboard is not None:
            for key, value in metrics.items():
                self.tensorboard.add_scalar(key, float(value), step)
            self.tensorboard.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} has no metrics.jsonl: is it a dapo-suite training run?")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
