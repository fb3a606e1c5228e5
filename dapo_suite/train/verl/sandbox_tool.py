"""dapo-suite's sandbox as a verl 0.9 tool (`BaseTool`), built by verl's agent loop from a tool config YAML
(dapo_suite/core/sandbox/python_tool.yaml names this class). One `Sandbox` per process, shared by the
trajectories; each call still runs in a fresh isolated worker. `execute` returns what the model is shown and
the call's outcome as a metric."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from dapo_suite.core.sandbox import Sandbox
from dapo_suite.core.sandbox.tool_config import limits_from

MAX_SHOWN = 256  # characters; verl's agent loop cuts again at multi_turn.max_tool_response_length


class SandboxTool(BaseTool):
    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema) -> None:
        super().__init__(config, tool_schema)
        limits = limits_from(config, f"tool {self.name}'s config")
        self.sandbox = Sandbox(limits, isolation=config.get("isolation", "bwrap"))

    async def create(self, instance_id: str | None = None, **kwargs) -> tuple[str, ToolResponse]:
        return instance_id or str(uuid4()), ToolResponse()

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs
    ) -> tuple[ToolResponse, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str):
            return ToolResponse(text="Error: the call needs a `code` string"), 0.0, {"outcome": "bad_call"}
        result = await asyncio.to_thread(self.sandbox.run, code)
        return (
            ToolResponse(text=result.model_view(MAX_SHOWN)),
            0.0,
            {"outcome": result.outcome, "execution_time": result.execution_time},
        )

    async def release(self, instance_id: str, **kwargs) -> None:
        return None
