"""Dynamic sampling with a bound: verl's V1 replay buffer, stopping when a step's groups keep being filtered.

DAPO (arXiv 2503.14476, sec. 3.2) over-samples and filters out groups whose answers are all right or all
wrong, sampling more until the batch is full; its recipe bounds the retries with `max_num_gen_batches` and
stops the run when they are used up ("Generated too many. Please check if your data are too difficult."). verl
0.9.1's V1 trainer filters in its replay buffer (`verl.trainer.ppo.v1.replay_buffer.ReplayBuffer`) and refills
without any bound: at 0 % accuracy it samples forever without a step. This subclass, plugged in through verl's
own hook (`trainer.v1.sampler.custom_sampler.{path,name}`), counts the groups the filter evicts per step and
stops the run once they exceed the user's budget, `max_num_gen_batches` x `gen_batch_size` prompts, with a
message that says what to change. The stop is also written to a JSON file the launcher reads, so the command
ends with that message rather than a Ray traceback.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any, NoReturn

from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer


class TooManyFilteredGroups(RuntimeError):
    """Dynamic sampling used up its budget in one step: nearly every group was all right or all wrong."""


def stop_message(step: int, filtered: int, budget: int, metric: str) -> str:
    return (
        f"dynamic sampling stopped at step {step}: {filtered} groups sampled for this step had the same "
        f"{metric} for every response (all right or all wrong), more than the budget of {budget} "
        f"(max_num_gen_batches x gen_batch_size). The data is too hard or too easy for this model: check the "
        f"reward on a few samples, use easier (or harder) problems, or raise --set max_num_gen_batches=N."
    )


def stop_run(stop_file: Path | None, step: int, filtered: int, budget: int, metric: str) -> NoReturn:
    """Write why the run stops where the launcher reads it, then stop it."""
    message = stop_message(step, filtered, budget, metric)
    if stop_file is not None:
        stop_file.parent.mkdir(parents=True, exist_ok=True)
        stop_file.write_text(
            json.dumps(
                {
                    "reason": "too_many_filtered_groups",
                    "step": step,
                    "filtered_groups": filtered,
                    "message": message,
                }
            )
        )
    raise TooManyFilteredGroups(message)


class CappedDAPOReplayBuffer(ReplayBuffer):
    """verl's sync replay buffer with DAPO group filtering on `metric` and at most `max_filtered_groups`
    filtered groups per step. verl gives a custom sampler only `sampler_kwargs`; these carry what verl's
    built-in buffer would have received (metric, train_batch_size) plus the budget and the stop file."""

    def __init__(self, *, sampler_kwargs: Any, **kwargs: Any) -> None:
        options = dict(sampler_kwargs)
        self.filter_metric = str(options["metric"])
        self.max_filtered_groups = int(options["max_filtered_groups"])
        self.stop_file = Path(options["stop_file"]) if options.get("stop_file") else None
        self.filtered_per_step: dict[int, int] = defaultdict(int)
        super().__init__(
            sampler_kwargs=sampler_kwargs,
            filter_groups_metric=self.filter_metric,
            train_batch_size=int(options["train_batch_size"]),
            gen_batch_size=1,
            max_inflight_gen_batches=1,
            **kwargs,
        )

    def _evict_terminal_groups(self, global_steps: int, partition_id: str, eviction_reasons: Any):
        evicted = super()._evict_terminal_groups(global_steps, partition_id, eviction_reasons)
        self.filtered_per_step[global_steps] += evicted[2]
        filtered = self.filtered_per_step[global_steps]
        if filtered > self.max_filtered_groups:
            stop_run(self.stop_file, global_steps, filtered, self.max_filtered_groups, self.filter_metric)
        return evicted
