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
  tool's tokens took part in);
- `ModelTokenRewardManager` is verl's DAPO reward manager given the model's own tokens only, with ReTool's
  shaping of a wrong answer by its tool calls when `tool_call_bonus` is set.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from verl import DataProto
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
from verl.experimental.agent_loop.tool_agent_loop import ToolAgentLoop
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager

from dapo_suite.train.algorithm import tool_call_shaping
from dapo_suite.train.verl.keys import OVERLONG_FILTER_LOSS

MODEL_MASK = "dapo_suite_model_mask"  # extra field: 1 at each of the model's own response positions
TRUNCATED = "dapo_suite_truncated"  # extra field: the trajectory reached the response length
AGENT_LOOP_CONFIG = Path(__file__).with_name("agent_loops.yaml")


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


class DAPOToolAgentLoop(ToolAgentLoop):
    """verl's tool agent loop with the model's own tokens recorded (`record_model_tokens`)."""

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        output = await super().run(sampling_params, **kwargs)
        loss_mode = self.config.actor_rollout_ref.actor.policy_loss.loss_mode
        return record_model_tokens(output, self.response_length, loss_mode.startswith(OVERLONG_FILTER_LOSS))


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
        result = await super().run_single(model_tokens_only(data))
        kwargs = self.config.reward.get("reward_kwargs", {})
        bonus = float(kwargs.get("tool_call_bonus", 0.0))
        info = result["reward_extra_info"]
        if bonus and not info.get("acc"):
            score = torch.tensor([float(info["score"])])
            shaped = tool_call_shaping(
                score,
                torch.tensor([False]),
                torch.tensor([tool_calls(data)]),
                bonus,
                float(kwargs.get("tool_call_bonus_cap", -0.6)),
            )
            result["reward_score"] += float(shaped - score)
            info["score"] = float(shaped)
        return result
