"""The tool config of a multi-turn run: a YAML in verl 0.9's shape
(`tools: [{class_name, config, tool_schema}]`), the shipped one by default (python_tool.yaml beside this
module). Both backends read the same file: verl builds its tools from it; the embedded trainer and eval take
the sandbox's limits from the Python tool's `config`."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import yaml

from dapo_suite.core.errors import UserError
from dapo_suite.core.sandbox.limits import SandboxLimits

DEFAULT_TOOL_CONFIG = Path(__file__).parent / "python_tool.yaml"
VERL_KEYS = ("type", "isolation")  # in a tool's config: verl's ToolType, and the isolation (not limits)


def tool_config_path(path: str | None) -> Path:
    return Path(path) if path else DEFAULT_TOOL_CONFIG


def sandbox_limits(path: str | None) -> SandboxLimits:
    """The sandbox limits of the config's one tool; errors name the file and the key."""
    file = tool_config_path(path)
    try:
        document = yaml.safe_load(file.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise UserError(f"tool config {file}: cannot be read ({error})") from None
    tools = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(tools, list) or len(tools) != 1 or not isinstance(tools[0], dict):
        raise UserError(
            f"tool config {file}: expected `tools:` with one tool (the Python sandbox), as "
            f"{DEFAULT_TOOL_CONFIG.name} has"
        )
    return limits_from(tools[0].get("config") or {}, f"tool config {file}: tools[0].config")


def limits_from(config: dict, where: str) -> SandboxLimits:
    """The limits in one tool's `config` mapping (verl's own keys, VERL_KEYS, are left to verl)."""
    known = {f.name for f in fields(SandboxLimits)}
    unknown = sorted(set(config) - known - set(VERL_KEYS))
    if unknown:
        raise UserError(
            f"{where} has unknown keys {unknown}; the sandbox's limits are {', '.join(sorted(known))}"
        )
    return SandboxLimits(**{key: value for key, value in config.items() if key in known})
