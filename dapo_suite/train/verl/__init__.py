"""The verl backend: a TrainConfig becomes the Hydra override list of `python -m verl.trainer.main_ppo`.

    dapo-suite train --backend verl --preset dapo --model Qwen/Qwen2.5-32B --nnodes 16 --gpus-per-node 8 \
        --train-file dapo-math-17k.parquet --out runs/dapo-32b --dry-run

One module per job: `keys` (the field -> verl key table and the override list), `validate` (verl's own config,
types, resources, inputs), `data` (paths and the AIME 2024 validation set), `launch` (dry run, local Ray or
`ray job submit`), `export` (checkpoint -> Hugging Face directory). `extensions` is what verl imports in its
workers (the overlong-filter losses); `async_entry` starts verl's async trainers with DAPO's group filter
(`async_trainers`, `group_filter`); on a CPU, `cpu_platform`, `cpu_rollout` and, for async runs,
`cpu_checkpoint_engine`. Those import verl and torch, so they are not imported here.
"""

from dapo_suite.train.verl.data import prepare, write_aime24_parquet
from dapo_suite.train.verl.export import export_command, latest_actor_dir, record_export
from dapo_suite.train.verl.keys import (
    ASYNC_TRAINERS,
    EXTENSION_MODULE,
    NOT_MAPPED,
    OVERLONG_FILTER_LOSS,
    VERL_KEYS,
    Hardware,
    VerlConfigError,
    overlong_filter_loss_name,
    split_gpus,
)
from dapo_suite.train.verl.launch import command, dry_run, launch, steps_short, stop_reason
from dapo_suite.train.verl.overrides import build_overrides
from dapo_suite.train.verl.validate import compose, validate

__all__ = [
    "ASYNC_TRAINERS",
    "EXTENSION_MODULE",
    "NOT_MAPPED",
    "OVERLONG_FILTER_LOSS",
    "VERL_KEYS",
    "Hardware",
    "VerlConfigError",
    "build_overrides",
    "command",
    "compose",
    "dry_run",
    "export_command",
    "record_export",
    "latest_actor_dir",
    "launch",
    "overlong_filter_loss_name",
    "prepare",
    "split_gpus",
    "steps_short",
    "stop_reason",
    "validate",
    "write_aime24_parquet",
]
