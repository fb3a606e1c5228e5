"""The data a verl run reads: absolute paths, and the shipped AIME 2024 as its validation set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dapo_suite.core.problems import benchmark_path
from dapo_suite.train.config import TrainConfig


def write_aime24_parquet(path: Path) -> Path:
    """AIME 2024 (30 problems) in verl's DAPO-Math schema; validation samples val_n per problem (mean@32)."""
    import pandas as pd

    from dapo_suite.core.prompts import chat_messages

    rows = []
    for index, line in enumerate(benchmark_path("aime24").read_text().splitlines()):
        item = json.loads(line)
        rows.append({"data_source": "aime24", "prompt": chat_messages(item["problem"]), "ability": "MATH",
                     "reward_model": {"ground_truth": str(item["answer"]), "style": "rule-lighteval/MATH_v2"},
                     "extra_info": {"index": index, "id": item["id"]}})
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def prepare(config: TrainConfig) -> TrainConfig:
    """Absolute data paths, and the shipped AIME 2024 as validation set when none is given."""
    import dataclasses

    changes: dict[str, Any] = {}
    for name in ("train_file", "val_file"):
        value = getattr(config, name)
        if value and "://" not in value:
            changes[name] = str(Path(value).expanduser().resolve())
    if not config.val_file:
        changes["val_file"] = str(write_aime24_parquet(Path(config.out).resolve() / "data" / "aime24.parquet"))
    return dataclasses.replace(config, **changes)

