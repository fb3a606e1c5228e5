"""The data a verl run reads: absolute paths; the built-in task written as parquet; AIME 2024 as validation
set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dapo_suite.core.problems import Problem, benchmark_path
from dapo_suite.train.config import PYTHON_BLOCK, TrainConfig


def write_parquet(
    problems: list[Problem], path: Path, data_source: str, shots: int = 0, tools: bool = False
) -> Path:
    """Problems in verl's DAPO-Math schema (prompt as chat messages, with `shots` worked examples before the
    problem as the embedded trainer renders them, the Python tool's instructions and examples with `tools`;
    ground truth in reward_model)."""
    import pandas as pd

    from dapo_suite.core.prompts import chat_messages

    rows = [
        {
            "data_source": data_source,
            "prompt": chat_messages(problem.problem, shots=shots, tools=tools),
            "ability": "MATH",
            "reward_model": {"ground_truth": str(problem.answer), "style": "rule-lighteval/MATH_v2"},
            "extra_info": {"index": index, "id": problem.id},
        }
        for index, problem in enumerate(problems)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(path)
    return path


def write_aime24_parquet(path: Path) -> Path:
    """AIME 2024 (30 problems) in verl's DAPO-Math schema; validation samples val_n per problem (mean@32)."""
    problems = [
        Problem(id=item["id"], problem=item["problem"], answer=str(item["answer"]))
        for item in map(json.loads, benchmark_path("aime24").read_text().splitlines())
    ]
    return write_parquet(problems, path, "aime24")


def prepare(config: TrainConfig) -> TrainConfig:
    """Absolute data paths. Without --train-file, the built-in task's train and held-out splits (the embedded
    trainer's, same seed) become RUN_DIR/data/{train,heldout}.parquet; with one but no --val-file, the shipped
    AIME 2024 is the validation set, as in the paper's run."""
    import dataclasses

    from dapo_suite.train.tasks import train_and_heldout

    changes: dict[str, Any] = {}
    for name in ("train_file", "val_file"):
        value = getattr(config, name)
        if value and "://" not in value:
            changes[name] = str(Path(value).expanduser().resolve())
    data_dir = Path(config.out).resolve() / "data"
    # python_block calls are asked for in the prompt (as the embedded trainer asks), hermes by the template
    blocks = config.multi_turn and config.tool_format == PYTHON_BLOCK
    if not config.train_file:
        train, heldout = train_and_heldout(config)
        changes["train_file"] = str(
            write_parquet(train, data_dir / "train.parquet", config.task, config.prompt_shots, blocks)
        )
        if not config.val_file:
            changes["val_file"] = str(
                write_parquet(heldout, data_dir / "heldout.parquet", config.task, config.prompt_shots, blocks)
            )
    elif not config.val_file:
        changes["val_file"] = str(write_aime24_parquet(data_dir / "aime24.parquet"))
    return dataclasses.replace(config, **changes)
