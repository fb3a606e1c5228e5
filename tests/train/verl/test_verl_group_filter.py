"""DAPO's group filter for verl's async trainers (dapo_suite/train/verl/group_filter.py), on verl's own
DataProto."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from verl.protocol import DataProto

from dapo_suite.train.verl.group_filter import GroupFilter, signal_rows, take_groups
from dapo_suite.train.verl.replay import TooManyFilteredGroups


def rollouts(accuracies: dict[str, list[float]], width: int = 3) -> DataProto:
    """Groups of responses as verl's agent loop hands them over: uid and reward_extra_info's acc per row, the
    reward at each response's last token in rm_scores."""
    uids = [uid for uid, accs in accuracies.items() for _ in accs]
    acc = np.array([a for accs in accuracies.values() for a in accs])
    rm_scores = torch.zeros(len(uids), width)
    rm_scores[:, -1] = torch.tensor(2 * acc - 1, dtype=torch.float32)
    responses = torch.arange(len(uids) * width).reshape(len(uids), width)
    return DataProto.from_dict(
        tensors={"responses": responses, "rm_scores": rm_scores},
        non_tensors={"uid": np.array(uids, dtype=object), "acc": acc},
    )


def test_only_groups_with_right_and_wrong_answers_are_kept_and_the_rest_counted():
    batch = rollouts({"a": [1, 0, 1], "b": [1, 1, 1], "c": [0, 0, 0], "d": [0, 0, 1]})
    group_filter = GroupFilter(metric="acc", budget=0)
    kept = group_filter.keep(batch, step=1)
    assert list(kept.non_tensor_batch["uid"]) == ["a"] * 3 + ["d"] * 3
    # the kept rows are the same rows, tensors and all
    assert torch.equal(
        kept.batch["responses"], torch.cat([batch.batch["responses"][:3], batch.batch["responses"][9:]])
    )
    assert group_filter.metrics() == {
        "dapo/kept_groups": 2,
        "dapo/filtered_groups": 2,
        "dapo/filtered_groups_this_step": 2,
    }
    assert group_filter.keep(rollouts({"e": [1, 1]}), step=1) is None
    assert group_filter.metrics()["dapo/filtered_groups"] == 3


def test_a_resumed_run_goes_on_counting_from_the_checkpoint_totals():
    group_filter = GroupFilter(metric="acc", budget=0)
    group_filter.keep(rollouts({"a": [1, 0], "b": [1, 1]}), step=1)
    resumed = GroupFilter(metric="acc", budget=0)
    resumed.restore(json.loads(json.dumps(group_filter.counts())))  # as a checkpoint holds them
    resumed.keep(rollouts({"c": [0, 1]}), step=2)
    assert resumed.metrics() == {
        "dapo/kept_groups": 2,
        "dapo/filtered_groups": 1,
        "dapo/filtered_groups_this_step": 0,
    }


def test_reward_metric_reads_verl_rm_scores():
    batch = rollouts({"a": [1, 0], "b": [1, 1]})
    del batch.non_tensor_batch["acc"]
    assert list(signal_rows(batch, "reward")) == [True, True, False, False]
    with pytest.raises(KeyError, match="dynamic sampling filters on 'acc'"):
        signal_rows(batch, "acc")


def test_bound_stops_a_run_whose_groups_have_no_signal_with_the_sync_message(tmp_path):
    stop_file = tmp_path / "stopped.json"
    group_filter = GroupFilter(metric="acc", budget=2, stop_file=stop_file)
    group_filter.keep(rollouts({"a": [1, 1], "b": [0, 0]}), step=3)
    group_filter.new_step()  # a new step's budget
    group_filter.keep(rollouts({"c": [1, 1], "d": [0, 0]}), step=4)
    with pytest.raises(TooManyFilteredGroups, match="dynamic sampling stopped at step 4: 3 groups") as stop:
        group_filter.keep(rollouts({"e": [0, 0], "f": [1, 0]}), step=4)
    assert "max_num_gen_batches" in str(stop.value)
    assert json.loads(stop_file.read_text())["message"] == str(stop.value)
    # budget 0: no bound
    assert (
        GroupFilter(metric="acc", budget=0).keep(rollouts({str(i): [0, 0] for i in range(50)}), step=1)
        is None
    )


def test_take_groups_fills_a_step_from_several_generation_batches():
    first = rollouts({"a": [1, 0], "b": [0, 1]})
    second = rollouts({"c": [1, 0], "d": [1, 0]})
    batch, surplus = take_groups([first, second], groups=3)
    assert list(batch.non_tensor_batch["uid"]) == ["a", "a", "b", "b", "c", "c"]
    assert surplus == 1
    assert batch.batch["rm_scores"].shape == (6, 3)
