"""The full Hydra override list of one verl run (`build_overrides`): keys.py's table and its pieces, the CPU
keys (cpu_keys.py) on a CPU, then the raw `verl.<key>=value` passthroughs, in Hydra's syntax
(`hydra_value`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from dapo_suite.train.config import TrainConfig
from dapo_suite.train.verl.cpu_keys import cpu_environment, cpu_overrides
from dapo_suite.train.verl.keys import (
    ASYNC_TRAINERS,
    PAPER_CONSTANTS,
    VERL_KEYS,
    WORKER_ENV,
    Hardware,
    VerlConfigError,
    async_overrides,
    hardware_overrides,
    model_path,
    replay_overrides,
    run_dir_overrides,
    training_side,
)


def model_overrides(config: TrainConfig) -> list[tuple[str, Any]]:
    """The model's own pad token id: verl replaces the model config's `pad_token_id` with the tokenizer's, and
    where the two differ (the embedded model: config 2, tokenizer 1) the embedding row that gets no gradient
    differs too, so verl would not train the same model the embedded trainer trains."""
    import json

    config_file = Path(model_path(config.model)) / "config.json"
    if not config_file.is_file():
        return []
    pad = json.loads(config_file.read_text()).get("pad_token_id")
    return [("+actor_rollout_ref.model.override_config.pad_token_id", pad)] if isinstance(pad, int) else []


def hydra_value(value: Any) -> str:
    """A Python value as Hydra override syntax."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(hydra_value(v) for v in value) + "]"
    text = str(value)
    reads_as_other = re.fullmatch(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?|true|false|null|", text, re.I)
    if re.fullmatch(r"[\w./~:@+-]*", text) and not reads_as_other:
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def build_overrides(
    config: TrainConfig, hw: Hardware, passthrough: list[str] | tuple[str, ...] = ()
) -> list[str]:
    """The full override list: table, paper constants, hardware, run directory, then raw passthroughs."""
    pairs: list[tuple[str, Any]] = []
    for row in VERL_KEYS:
        value = row.convert(getattr(config, row.field), config)
        pairs += [(key, value) for key in row.keys]
    pairs += list(PAPER_CONSTANTS) + hardware_overrides(config, training_side(config, hw))
    pairs += run_dir_overrides(config)
    # verl's V1 replay buffer bounds the sync trainer's filter; the async entry filters where rollouts are
    # produced
    pairs += async_overrides(config, hw) if config.async_mode in ASYNC_TRAINERS else replay_overrides(config)
    pairs += model_overrides(config)
    if hw.device == "cpu":
        pairs += cpu_overrides(config, hw)
        pairs += [(f"{WORKER_ENV}.{name}", value) for name, value in cpu_environment().items()]
    overrides = {key: f"{key}={hydra_value(value)}" for key, value in pairs}
    for raw in passthrough:
        if "=" not in raw:
            raise VerlConfigError(f"--set verl.{raw!r}: expected verl.<hydra.key>=value")
        key = raw.split("=", 1)[0]
        plain = key.lstrip("+~")
        # a passthrough replaces the generated value of the same key (Hydra rejects a key given twice)
        for existing in [k for k in overrides if k.lstrip("+") == plain]:
            del overrides[existing]
        overrides[key] = raw
    return list(overrides.values())
