"""DAPO's group filter for verl's async trainers, applied where their rollouts are produced.

Dynamic sampling (DAPO sec. 3.2) trains only on groups whose responses differ in the filter metric (some
right, some wrong): a group that is all right or all wrong has zero advantage everywhere and only dilutes the
batch. verl 0.9.1's synchronous V1 trainer filters in its replay buffer (`replay.py` bounds it); its async
trainers do not filter at all. `GroupFilter` does it on verl's own `DataProto` as generation hands it over, by
verl's rule (the V1 replay buffer's): a group is dropped when its metric values are all equal, the metric
being `reward_extra_info[metric]` (the reward loop puts it in `non_tensor_batch`) or, for "reward", the summed
`rm_scores`. Dropped groups are counted, and past `budget` dropped groups in one step the run stops with the
same message and stop file as the synchronous bound (`replay.stop_run`).

`take_groups` assembles a step's batch from several filtered generation batches (the one-step trainer's
refill).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from verl.protocol import DataProto

from dapo_suite.train.verl.replay import stop_run

# verl's name for the canonical reward (correctness plus the overlong penalty), read from rm_scores
REWARD_METRIC = "reward"


def row_values(batch: DataProto, metric: str) -> np.ndarray:
    """The filter metric of every row (response)."""
    if metric in batch.non_tensor_batch:
        return np.asarray(batch.non_tensor_batch[metric], dtype=np.float64)
    if metric == REWARD_METRIC and batch.batch is not None and "rm_scores" in batch.batch.keys():
        return batch.batch["rm_scores"].sum(dim=-1).double().numpy()
    raise KeyError(
        f"dynamic sampling filters on {metric!r}, which the rollouts do not carry (non-tensor keys: "
        f"{sorted(batch.non_tensor_batch)}): the reward function must return it (compute_score's acc)"
    )


def signal_rows(batch: DataProto, metric: str) -> np.ndarray:
    """(rows,) bool: True where the row's group (same uid) has at least two different metric values."""
    uids = batch.non_tensor_batch["uid"]
    values = row_values(batch, metric)
    mixed = {uid for uid in set(uids) if np.ptp(values[uids == uid]) > 0}
    return np.array([uid in mixed for uid in uids], dtype=bool)


def group_count(batch: DataProto) -> int:
    return len(set(batch.non_tensor_batch["uid"]))


@dataclass
class GroupFilter:
    """Counts of one run's filter, and its bound: `budget` dropped groups a step (0 = no bound)."""

    metric: str
    budget: int
    stop_file: Path | None = None
    kept: int = 0
    dropped: int = 0
    dropped_this_step: int = 0

    @classmethod
    def from_config(cls, config: Any) -> GroupFilter | None:
        """The filter a composed verl config asks for (the keys `keys.async_overrides` writes); None when
        off."""
        groups = config.algorithm.get("filter_groups") or {}
        if not groups.get("enable", False):
            return None
        options = config.get("dapo_suite", {}).get("dynamic_sampling", {})
        stop_file = options.get("stop_file")
        return cls(
            metric=groups.get("metric") or REWARD_METRIC,
            budget=int(options.get("max_filtered_groups", 0)),
            stop_file=Path(stop_file) if stop_file else None,
        )

    def new_step(self) -> None:
        self.dropped_this_step = 0

    def keep(self, batch: DataProto, step: int) -> DataProto | None:
        """The rows of `batch` whose groups have signal (None when no group has); stops the run past the
        bound."""
        rows = signal_rows(batch, self.metric)
        groups = group_count(batch)
        kept = len(set(batch.non_tensor_batch["uid"][rows]))
        self.kept += kept
        self.dropped += groups - kept
        self.dropped_this_step += groups - kept
        if self.budget and self.dropped_this_step > self.budget:
            stop_run(self.stop_file, step, self.dropped_this_step, self.budget, self.metric)
        return batch.select_idxs(rows) if kept else None

    def counts(self) -> dict[str, int]:
        """The run's totals, which a checkpoint keeps so that a resumed run goes on counting (`restore`)."""
        return {"kept": self.kept, "dropped": self.dropped}

    def restore(self, counts: dict[str, int]) -> None:
        self.kept, self.dropped = int(counts["kept"]), int(counts["dropped"])

    def metrics(self) -> dict[str, float]:
        return {
            "dapo/kept_groups": self.kept,
            "dapo/filtered_groups": self.dropped,
            "dapo/filtered_groups_this_step": self.dropped_this_step,
        }


def take_groups(batches: list[DataProto], groups: int) -> tuple[DataProto, int]:
    """The first `groups` groups (by first appearance) of the concatenated batches, and how many were left
    over."""
    batch = DataProto.concat(batches)
    uids = batch.non_tensor_batch["uid"]
    order = list(dict.fromkeys(uids))
    chosen = set(order[:groups])
    return batch.select_idxs(np.array([uid in chosen for uid in uids], dtype=bool)), len(order) - len(chosen)
