"""A tool trajectory's length bookkeeping on verl, as on the embedded path: the grade and the soft overlong
penalty (DAPO eq. 13, arXiv 2503.14476) read the model's own tokens, a tool's output counts for neither, and
overlong filtering (sec. 3.4) drops a trajectory that reached the length limit.

verl 0.9.1 gets two of these wrong for multi-turn runs. Its DAPO reward manager measures a response by the
attention mask, so a tool's output counts toward the penalty and is decoded into the text it grades
(experimental/reward_loop/reward_manager/dapo.py; OpenRLHF #1243 is the same bug). And the agent loop hands
the reward loop no `response_mask`, only each trajectory's `extra_fields`. So:

- `DAPOToolAgentLoop` (agent loop `dapo_tool_agent`, registered through `AGENT_LOOP_CONFIG`) is verl's
  `tool_agent` loop that also records the model's own positions in the trajectory's extra fields, and, under
  overlong filtering, masks a truncated trajectory out of the loss (verl's loss sees only `response_mask`,
  whose sum is the model's tokens, so the single-turn filter's "sum reached L_max" cannot see a cut that a
  tool's tokens took part in); with the python_block format it writes the tool's output as the embedded loop
  does, an ```output block in the model's own turn, where verl's would open a chat-template `tool` turn;
- `PythonBlockToolParser` (`multi_turn.format=python_block`) reads the embedded loop's ```python blocks as
  calls of the sandbox tool, so a model calls the tool the same way on both backends;
- `ModelTokenRewardManager` is verl's DAPO reward manager given the model's own tokens only, with ReTool's
  shaping of a wrong answer by its tool calls when `tool_call_bonus` is set.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import AgentData, AgentState, ToolAgentLoop
from verl.experimental.agent_loop.tool_parser import FunctionCall, ToolParser
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
from verl.tools.schemas import OpenAIFunctionToolSchema

from dapo_suite.inference.tool_loop import CODE_BLOCK, tool_turn_text
from dapo_suite.train.algorithm import tool_call_shaping
from dapo_suite.train.config import PYTHON_BLOCK
from dapo_suite.train.verl.keys import OVERLONG_FILTER_LOSS

MODEL_MASK = "dapo_suite_model_mask"  # extra field: 1 at each of the model's own response positions
TRUNCATED = "dapo_suite_truncated"  # extra field: the trajectory reached the response length
AGENT_LOOP_CONFIG = Path(__file__).with_name("agent_loops.yaml")
OUTPUT_FENCE = "```output"  # where the tool's turn begins (tool_loop.tool_turn_text)


def record_model_tokens(
    output: AgentLoopOutput, response_length: int, overlong_filter: bool
) -> AgentLoopOutput:
    """Record the model's own positions and the truncation in `output.extra_fields`; under overlong filtering,
    zero a truncated trajectory's `response_mask`, so that it carries no loss and no token of the
    denominator, as the embedded trainer drops it before the update. Returns `output`, changed in place."""
    truncated = len(output.response_ids) >= response_length
    output.extra_fields[MODEL_MASK] = list(output.response_mask)
    output.extra_fields[TRUNCATED] = truncated
    if overlong_filter and truncated:
        output.response_mask = [0] * len(output.response_mask)
    return output


@ToolParser.register(PYTHON_BLOCK)
class PythonBlockToolParser(ToolParser):
    """The embedded loop's tool format on verl (`multi_turn.format=python_block`): the last ```python block
    of a model turn is a call of the config's one tool with that code (`{"code": ...}`, the sandbox tool's
    schema). The turn's text stays the model's content, block included, as the embedded loop keeps it."""

    async def extract_tool_calls(
        self, responses_ids: list[int], tools: list[OpenAIFunctionToolSchema] | None = None
    ) -> tuple[str, list[FunctionCall]]:
        text = self.tokenizer.decode(responses_ids, skip_special_tokens=True)
        blocks = CODE_BLOCK.findall(text)
        if not blocks:
            return text, []
        name = tools[0].function.name if tools else "code_interpreter"
        return text, [FunctionCall(name=name, arguments=json.dumps({"code": blocks[-1]}))]


class DAPOToolAgentLoop(ToolAgentLoop):
    """verl's tool agent loop with the model's own tokens recorded (`record_model_tokens`); with the
    python_block format, a model turn stops where the tool's ```output block would begin, which the prompt's
    worked example puts right after the code, so the model cannot go on to invent its own output (the embedded
    loop stops at the block's end)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        if self.tool_parser_name == PYTHON_BLOCK:
            sampling_params = {**sampling_params, "stop": [*sampling_params.get("stop", []), OUTPUT_FENCE]}
        output = await super().run(sampling_params, **kwargs)
        loss_mode = self.config.actor_rollout_ref.actor.policy_loss.loss_mode
        return record_model_tokens(output, self.response_length, loss_mode.startswith(OVERLONG_FILTER_LOSS))

    async def _handle_processing_tools_state(self, agent_data: AgentData) -> AgentState:
        """With the python_block format, the tool's output continues the model's turn as an ```output block,
        as in the prompt's worked example and the embedded loop (verl's chat-template `tool` turn would show
        the model a format it was never prompted with); cut at the response budget, masked out of the loss."""
        if self.tool_parser_name != PYTHON_BLOCK:
            return await super()._handle_processing_tools_state(agent_data)
        response, _, _ = await self._call_tool(agent_data.tool_calls[0], agent_data.tools_kwargs, agent_data)
        model_text = self.tokenizer.decode(agent_data.response_ids, skip_special_tokens=True)
        turn = tool_turn_after(model_text, response.text or "")
        room = self.response_length - len(agent_data.response_mask)
        ids = self.tokenizer.encode(turn, add_special_tokens=False)[: max(room, 0)]
        agent_data.prompt_ids = [*agent_data.prompt_ids, *ids]
        agent_data.response_mask = [*agent_data.response_mask, *[0] * len(ids)]
        if agent_data.response_logprobs:
            agent_data.response_logprobs = [*agent_data.response_logprobs, *[0.0] * len(ids)]
        agent_data.user_turns += 1
        if len(agent_data.response_mask) >= self.response_length:
            return AgentState.TERMINATED
        return AgentState.GENERATING


def tool_turn_after(model_text: str, shown: str) -> str:
    """The tool's turn as the embedded loop writes it (an ```output block in the model's own turn), less the
    fence when the model's text already ends with it (vLLM keeps a stop string's tokens in the ids)."""
    fence_at = model_text.rfind(OUTPUT_FENCE)
    if fence_at != -1 and not model_text[fence_at + len(OUTPUT_FENCE) :].strip():
        return f"\n{shown}\n```\n"
    return tool_turn_text(shown, model_text.endswith("\n"))


def model_tokens_only(data: DataProto) -> DataProto:
    """One trajectory (the reward loop's `data`, its last row) with the response cut down to the model's own
    tokens, as `record_model_tokens` marked them; `data`'s last row unchanged when nothing is marked (a
    single-turn row, or another agent loop's)."""
    last = data[-1:]
    extra = last.non_tensor_batch.get("tool_extra_fields")
    mask = None if extra is None else (extra[0] or {}).get(MODEL_MASK)
    if mask is None:
        return last
    prompt = last.batch["prompts"][0]
    response = last.batch["responses"][0][: len(mask)]
    own = response[torch.tensor(mask, dtype=torch.bool)]
    input_ids = torch.cat([prompt, own])
    batch = TensorDict(
        {
            "prompts": prompt[None],
            "responses": own[None],
            "input_ids": input_ids[None],
            "attention_mask": torch.ones_like(input_ids)[None],
        },
        batch_size=1,
    )
    return DataProto(
        batch=batch, non_tensor_batch=dict(last.non_tensor_batch), meta_info=dict(last.meta_info)
    )


def tool_calls(data: DataProto) -> int:
    """Tool calls of the trajectory, from verl's turn count (user prompt, then a model turn and a tool
    response per call, then the last model turn), as the ReTool recipe counts them."""
    turns = data.non_tensor_batch.get("__num_turns__")
    return 0 if turns is None else max(int(turns[-1]) - 2, 0) // 2


class ModelTokenRewardManager(DAPORewardManager):
    """verl's DAPO reward manager (`dapo`: correctness by `compute_score`, the soft overlong penalty on the
    response's length) over the model's own tokens: what it grades and what it measures leave a tool's
    output out. With `reward_kwargs.tool_call_bonus`, ReTool's shaping of a wrong answer's score
    (`algorithm.tool_call_shaping`), as the embedded trainer applies it."""

    async def run_single(self, data: DataProto) -> dict:
        own = model_tokens_only(data)
        result = await super().run_single(own)
        kwargs = self.config.reward.get("reward_kwargs", {})
        bonus = float(kwargs.get("tool_call_bonus", 0.0))
        info = result["reward_extra_info"]
        # per sample: the calls and each side's tokens (validation logs them as val-aux/<source>/<key>/mean@n)
        last = data[-1:]
        info["tool_calls"] = tool_calls(last)
        info["model_tokens"] = int(own.batch["responses"].shape[-1])
        info["response_tokens"] = int(
            last.batch["attention_mask"][0, last.batch["prompts"].shape[-1] :].sum()
        )
        if bonus and not info.get("acc"):
            score = torch.tensor([float(info["score"])])
            shaped = tool_call_shaping(
                score,
                torch.tensor([False]),
                torch.tensor([info["tool_calls"]]),
                bonus,
                float(kwargs.get("tool_call_bonus_cap", -0.6)),
            )
            result["reward_score"] += float(shaped - score)
            info["score"] = float(shaped)
        return result
