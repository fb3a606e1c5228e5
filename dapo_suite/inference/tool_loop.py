"""Multi-turn sampling with a Python tool: the model writes a
```python block, generation stops at its end, the sandbox runs it, its output is appended as the tool's turn
and generation goes on, up to `max_assistant_turns` model turns and one response budget.

    engine = ToolEngine(HFEngine(model, tokenizer), Sandbox(), ToolSettings())
    engine.generate(requests, sampling, emit)      # Completion.response_mask: 1 model, 0 tool

The tool's turn is text inside the assistant's turn, as ToRL and the issue's probe write it:

    ```python
    print(237 + 574)
    ```
    ```output
    811
    ```

Its tokens are context for what follows and carry no loss: `Completion.response_mask` is 0 on them (verl's
`response_mask`). The budget (`Sampling.max_tokens`, verl's `response_length`) bounds model and tool tokens
together, as the memory a sequence needs does; a trajectory that reaches it is truncated ("length"). Token ids
are kept exact across turns: each turn continues the previous turns' ids, never a re-tokenised text.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from dapo_suite.core.prompts import render_chat
from dapo_suite.core.sandbox import RunResult, Sandbox
from dapo_suite.core.sandbox.limits import TRUNCATE_SIDES
from dapo_suite.inference.engines import Completion, Emit, Request, Sampling, group_by_problem
from dapo_suite.inference.prefill import PrefixCache

CODE_BLOCK = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class ToolSettings:
    """verl 0.9's `actor_rollout_ref.rollout.multi_turn` keys, as the embedded loop reads them."""

    # model turns; a code block in the last one is not run and ends the trajectory
    max_assistant_turns: int = 4
    max_tool_response_length: int = 256  # characters of a tool output the model sees
    tool_response_truncate_side: str = "middle"  # left, middle or right: which part of a long output is cut

    def __post_init__(self) -> None:
        if self.max_assistant_turns < 1:
            raise ValueError(f"max_assistant_turns must be >= 1, got {self.max_assistant_turns}")
        if self.max_tool_response_length < 1:
            raise ValueError(f"max_tool_response_length must be >= 1, got {self.max_tool_response_length}")
        if self.tool_response_truncate_side not in TRUNCATE_SIDES:
            raise ValueError(
                f"tool_response_truncate_side must be one of {', '.join(TRUNCATE_SIDES)}, got "
                f"{self.tool_response_truncate_side!r}"
            )


@dataclass(frozen=True)
class ToolCall:
    """One executed code block: the code, how it ended (sandbox outcome), the text the model was shown, and
    the tool tokens that text became (cut where the budget ended)."""

    code: str
    outcome: str
    shown: str
    tool_tokens: int
    execution_time: float

    def as_dict(self) -> dict:
        return {
            "code": self.code,
            "outcome": self.outcome,
            "output": self.shown,
            "tool_tokens": self.tool_tokens,
            "execution_time": self.execution_time,
        }


TIME_LIMITS = ("timeout", "cpu_limit")  # sandbox outcomes of a call stopped for time


def tool_use(outcomes: list[list[str]]) -> dict:
    """Tool use over responses, each given as its calls' sandbox outcomes: calls per response, the share of
    responses that call, failed calls (any outcome but ok) and their share (None without a call), and calls
    stopped at a time limit. The trainer's `tool/*` metrics and eval's tool statistics both read it."""
    calls = [outcome for response in outcomes for outcome in response]
    failed = sum(outcome != "ok" for outcome in calls)
    count = max(len(outcomes), 1)
    return {
        "calls_per_response": len(calls) / count,
        "call_rate": sum(bool(r) for r in outcomes) / count,
        "failed_calls": failed,
        "failed_call_rate": failed / len(calls) if calls else None,
        "timeouts": sum(outcome in TIME_LIMITS for outcome in calls),
    }


def tool_turn_text(shown: str, after_newline: bool) -> str:
    """The tool's turn as the model reads it: an ```output block right after the model's closing fence."""
    return ("" if after_newline else "\n") + f"```output\n{shown}\n```\n"


def last_code_block(text: str) -> str | None:
    """The code of the last complete ```python block, if the text ends with one (only whitespace after)."""
    matches = list(CODE_BLOCK.finditer(text))
    if not matches or text[matches[-1].end() :].strip():
        return None
    return matches[-1].group(1)


class CodeBlockStop:
    """Stops a row once its current turn holds a complete
    ```python block (sampling.StopRule). Asked only after tokens that contain a backtick."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        vocabulary = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        self.trigger_ids = torch.tensor([i for i, token in enumerate(vocabulary) if token and "`" in token])

    def matches(self, row: int, tokens: torch.Tensor) -> bool:
        return last_code_block(self.tokenizer.decode(tokens, skip_special_tokens=True)) is not None


@dataclass
class Trajectory:
    """One sample's response as it grows over turns: ids, the sampler's log-probs (0 on tool tokens), the
    mask."""

    context: torch.Tensor  # the prompt's ids
    token_ids: list[torch.Tensor] = field(default_factory=list)
    log_probs: list[torch.Tensor] = field(default_factory=list)
    entropies: list[torch.Tensor] = field(default_factory=list)
    mask: list[torch.Tensor] = field(default_factory=list)
    calls: list[ToolCall] = field(default_factory=list)
    turns: int = 0
    finish: str = "stop"

    @property
    def length(self) -> int:
        return sum(t.numel() for t in self.token_ids)

    def add(
        self,
        tokens: torch.Tensor,
        log_probs: torch.Tensor,
        from_model: bool,
        entropies: torch.Tensor | None = None,
    ) -> None:
        self.token_ids.append(tokens)
        self.log_probs.append(log_probs)
        self.entropies.append(torch.zeros(tokens.numel()) if entropies is None else entropies)
        self.mask.append(torch.full((tokens.numel(),), 1.0 if from_model else 0.0))

    def ids(self) -> torch.Tensor:
        return torch.cat([self.context, *self.token_ids])


class ToolEngine:
    """An engine (the `Engine` protocol) that runs the multi-turn loop over an inner engine with
    `continue_ids` (the HF engine). Randomness: one stream through the call, `Sampling.seed`, else the first
    request's seed, else torch's global generator (the trainer's rollouts follow its seed)."""

    name = "tools"

    def __init__(self, inner, sandbox: Sandbox, settings: ToolSettings | None = None) -> None:
        if not hasattr(inner, "continue_ids"):
            raise ValueError(
                f"multi-turn rollouts need the hf engine; the {inner.name} engine cannot continue a "
                "token context (use rollout_engine=hf, or --engine hf)"
            )
        self.inner, self.sandbox, self.settings = inner, sandbox, settings or ToolSettings()
        self.tokenizer = inner.tokenizer
        self.stop_rule = CodeBlockStop(self.tokenizer)
        self._prefixes = PrefixCache()

    def sync_weights(self) -> None:
        self.inner.sync_weights()

    def generate(self, requests: Sequence[Request], sampling: Sampling, emit: Emit) -> None:
        if not requests:
            return
        by_problem = group_by_problem(requests)
        texts = [
            render_chat(self.tokenizer, requests[rows[0]].prompt)
            if sampling.chat_template
            else requests[rows[0]].prompt
            for rows in by_problem.values()
        ]
        contexts = [
            torch.tensor(ids, dtype=torch.long)
            for ids in self.tokenizer(texts, add_special_tokens=False)["input_ids"]
        ]
        seed = sampling.seed if sampling.seed is not None else requests[0].seed
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        sizes = {len(rows) for rows in by_problem.values()}
        # Later turns run each sample's whole context again: the beginning all share (chat template, worked
        # example) is computed once. Per call: the cache holds keys of this snapshot of the weights only.
        self._prefixes = PrefixCache()
        trajectories = self._first_turn(
            contexts, [len(rows) for rows in by_problem.values()], sizes, sampling, generator
        )
        self._continue(trajectories, sampling, generator)
        order = [index for rows in by_problem.values() for index in rows]
        for index, trajectory in zip(order, trajectories, strict=True):
            emit(self._completion(requests[index], trajectory))

    def _first_turn(self, contexts, counts, sizes, sampling, generator) -> list[Trajectory]:
        if len(sizes) == 1:  # every problem's samples share its prompt's KV cache
            pieces = self.inner.continue_ids(
                contexts, counts[0], sampling, generator, self.stop_rule, self._prefixes
            )
            rows = [c for c, n in zip(contexts, counts, strict=True) for _ in range(n)]
        else:
            rows = [c for c, n in zip(contexts, counts, strict=True) for _ in range(n)]
            pieces = self.inner.continue_ids(rows, 1, sampling, generator, self.stop_rule, self._prefixes)
        trajectories = []
        for context, piece in zip(rows, pieces, strict=True):
            trajectory = Trajectory(context)
            self._take_turn(trajectory, piece, sampling.max_tokens)
            trajectories.append(trajectory)
        return trajectories

    def _take_turn(self, trajectory: Trajectory, piece, budget: int) -> None:
        """Append a model turn, cut to what is left of the budget."""
        room = budget - trajectory.length
        tokens, log_probs, finish, entropies = piece.token_ids, piece.log_probs, piece.finish, piece.entropies
        if tokens.numel() > room:
            tokens, log_probs, finish = tokens[:room], log_probs[:room], "length"
            entropies = None if entropies is None else entropies[:room]
        trajectory.add(tokens, log_probs, from_model=True, entropies=entropies)
        trajectory.turns += 1
        trajectory.finish = finish

    def _continue(self, trajectories: list[Trajectory], sampling: Sampling, generator) -> None:
        settings = self.settings
        with ThreadPoolExecutor(max_workers=max(self.sandbox.pool_size, 1)) as pool:
            while True:
                calling = [t for t in trajectories if t.finish == "tool"]
                if not calling:
                    return
                last = [t for t in calling if t.turns >= settings.max_assistant_turns]
                for trajectory in last:
                    trajectory.finish = "stop"  # a block in the last allowed turn: not run, the response ends
                calling = [t for t in calling if t.turns < settings.max_assistant_turns]
                codes = [
                    last_code_block(self.tokenizer.decode(t.token_ids[-1], skip_special_tokens=True))
                    for t in calling
                ]
                results = list(pool.map(self.sandbox.run, codes))
                going = [
                    t
                    for t, code, result in zip(calling, codes, results, strict=True)
                    if self._add_tool_turn(t, code, result, sampling.max_tokens)
                ]
                if not going:
                    return
                room = max(sampling.max_tokens - t.length for t in going)
                turn = Sampling(sampling.temperature, sampling.top_p, room, chat_template=False)
                pieces = self.inner.continue_ids(
                    [t.ids() for t in going], 1, turn, generator, self.stop_rule, self._prefixes
                )
                for trajectory, piece in zip(going, pieces, strict=True):
                    self._take_turn(trajectory, piece, sampling.max_tokens)

    def _add_tool_turn(self, trajectory: Trajectory, code: str, result: RunResult, budget: int) -> bool:
        """Append the tool's turn; False when the budget ends inside it (the trajectory is then truncated)."""
        settings = self.settings
        shown = result.model_view(settings.max_tool_response_length, settings.tool_response_truncate_side)
        model_text = self.tokenizer.decode(trajectory.token_ids[-1], skip_special_tokens=True)
        text = tool_turn_text(shown, model_text.endswith("\n"))
        tokens = torch.tensor(self.tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)
        room = budget - trajectory.length
        kept = tokens[:room]
        trajectory.add(kept, torch.zeros(kept.numel()), from_model=False)
        trajectory.calls.append(
            ToolCall(code, result.outcome, shown, int(kept.numel()), result.execution_time)
        )
        if tokens.numel() >= room:
            trajectory.finish = "length"
            return False
        return True

    def _completion(self, request: Request, trajectory: Trajectory) -> Completion:
        tokens = torch.cat(trajectory.token_ids) if trajectory.token_ids else torch.zeros(0, dtype=torch.long)
        log_probs = torch.cat(trajectory.log_probs) if trajectory.log_probs else torch.zeros(0)
        mask = torch.cat(trajectory.mask) if trajectory.mask else torch.zeros(0)
        entropies = torch.cat(trajectory.entropies) if trajectory.entropies else torch.zeros(0)
        ended = trajectory.finish == "stop" and tokens.numel() and int(tokens[-1]) in self.inner.eos_ids
        shown = tokens[:-1] if ended else tokens
        text = self.tokenizer.decode(shown, skip_special_tokens=True)
        own = [
            t for t, m in zip(trajectory.token_ids, trajectory.mask, strict=True) if m.numel() and m[0] > 0
        ]
        model_text = self.tokenizer.decode(torch.cat(own), skip_special_tokens=True) if own else ""
        return Completion(
            request.problem_id,
            request.sample_index,
            text,
            "length" if trajectory.finish == "length" else "stop",
            int(tokens.numel()),
            tokens,
            log_probs,
            entropies,
            response_mask=mask,
            tool_calls=tuple(trajectory.calls),
            model_text=model_text,
        )
