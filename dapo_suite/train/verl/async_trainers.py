"""verl 0.9.1's async trainers with DAPO's group filter where their rollouts are produced (no verl file
edited).

- one-step off-policy (`verl/experimental/one_step_off_policy`): the batch of step k+1 is generated while step
  k trains. `DAPOOneStepTrainer` makes that generation task a dynamic-sampling loop: it samples generation
  batches of `data.gen_batch_size` prompts, keeps the groups with signal, and hands the trainer exactly
  `data.train_batch_size` of them (surplus discarded and counted, as verl's V1 buffer does).
- fully async (`verl/experimental/fully_async_policy`): a rollouter streams one group at a time into a queue.
  `DAPOFullyAsyncRollouter` drops a group without signal before it enters the queue, gives its place in the
  staleness bound back, and feeds a fresh prompt in its stead (the refill of dynamic sampling, without a
  barrier).

Both count kept and dropped groups (`dapo/*` metrics; the fully async trainer logs the rollouter's as
`fully_async/dapo/*`) and stop the run past `max_num_gen_batches x gen_batch_size` dropped groups in one step.

A one-step checkpoint of step k holds the data loader and the filter's totals as they were when step k's batch
was complete: verl saves the data loader as it is at the save, when step k+1's batch has already been drawn,
so a run resumed from it would skip those prompts, and the totals would restart at zero. A fully async
checkpoint holds the rollouter's totals; its data loader is verl's, as of the save (the groups then in flight
or queued are not kept: verl's own TODO), so a resumed run skips at most those prompts.

verl's async entry points take their trainer classes from module globals, not from the config, so the task
runners here put these subclasses in those globals, in their own Ray process, just before verl's method that
uses them.
"""

from __future__ import annotations

import copy
import json
import os
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import ray
import torch
from verl.experimental.fully_async_policy import fully_async_main
from verl.experimental.fully_async_policy.fully_async_rollouter import FullyAsyncRollouter
from verl.experimental.one_step_off_policy import main_ppo as one_step_main
from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer
from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path

from dapo_suite.train.verl.group_filter import GroupFilter, group_count, take_groups
from dapo_suite.train.verl.replay import TooManyFilteredGroups

# beside verl's files in an async checkpoint's global_step_N: the group filter's totals (GroupFilter.counts)
FILTER_STATE = "dapo_group_filter.json"


class DAPOOneStepTrainer(OneStepOffRayTrainer):
    """verl's one-step off-policy trainer whose next batch holds only groups with signal."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # verl's one-step __init__ skips the base trainer's, which starts the writer of validation generations
        self._init_dump_executor()
        self.group_filter = GroupFilter.from_config(self.config)
        # (data loader state, filter totals) as of each generated batch not yet trained, oldest first
        self._generated_states: deque[tuple[dict, dict | None]] = deque()
        self._step_state: tuple[dict, dict | None] | None = None  # that of the batch the current step trains

    async def _async_gen_next_batch(self, continuous_iterator):
        produced = await self._filtered_batch(continuous_iterator)
        if produced is not None:
            counts = self.group_filter.counts() if self.group_filter is not None else None
            self._generated_states.append((copy.deepcopy(self.train_dataloader.state_dict()), counts))
        return produced

    async def _fit_generate(self, batch_data_future, continuous_iterator):
        # verl's awaits this step's batch, then starts generating the next one, which draws from the data at
        # once
        result = await super()._fit_generate(batch_data_future, continuous_iterator)
        self._step_state = self._generated_states.popleft()
        return result

    def _checkpoint_folder(self) -> Path:
        return Path(self.config.trainer.default_local_dir) / f"global_step_{self.global_steps}"

    def _save_checkpoint(self) -> None:
        if self._step_state is None:
            return super()._save_checkpoint()
        data_state, counts = self._step_state
        folder = self._checkpoint_folder()
        folder.mkdir(parents=True, exist_ok=True)
        if (
            counts is not None
        ):  # before verl's marker of a complete checkpoint (latest_checkpointed_iteration.txt)
            (folder / FILTER_STATE).write_text(json.dumps(counts))
        super()._save_checkpoint()
        # verl's data.pt already counts the next step's batch; replaced at once, so a kill leaves one or the
        # other
        partial = folder / "data.pt.partial"
        torch.save(data_state, partial)
        os.replace(partial, folder / "data.pt")

    def _load_checkpoint(self):
        loaded = super()._load_checkpoint()
        saved = self._checkpoint_folder() / FILTER_STATE
        if self.group_filter is not None and self.global_steps and saved.is_file():
            self.group_filter.restore(json.loads(saved.read_text()))
        return loaded

    async def _filtered_batch(self, continuous_iterator):
        if self.group_filter is None:
            return await super()._async_gen_next_batch(continuous_iterator)
        self.group_filter.new_step()
        target = self.config.data.train_batch_size
        parts: list = []
        timing: dict[str, float] = {}
        generated = 0
        while sum(group_count(part) for part in parts) < target:
            produced = await super()._async_gen_next_batch(continuous_iterator)
            if produced is None:
                return None  # the data ran out before a full batch of groups with signal
            metrics, batch_timing, epoch, batch, future_reward = produced
            generated += 1
            for name, seconds in batch_timing.items():
                timing[name] = timing.get(name, 0.0) + seconds
            # per generation batch; set again for the assembled batch below
            agent_timing = batch.meta_info.pop("timing", {})
            batch.meta_info.pop("global_token_num", None)
            kept = self.group_filter.keep(batch, self.global_steps)
            if kept is not None:
                parts.append(kept)
        batch, surplus = take_groups(parts, target)
        batch.meta_info["timing"] = agent_timing
        if self.config.trainer.balance_batch:
            self._balance_batch(batch, metrics=metrics)
        batch.meta_info["global_token_num"] = torch.sum(batch.batch["attention_mask"], dim=-1).tolist()
        metrics = {
            **metrics,
            **self.group_filter.metrics(),
            "dapo/num_gen_batches": generated,
            "dapo/discarded_surplus_groups": surplus,
        }
        return metrics, timing, epoch, batch, future_reward


class DAPOFullyAsyncRollouter(FullyAsyncRollouter.__ray_actor_class__):
    """verl's fully async rollouter; only groups with signal enter the queue."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group_filter = GroupFilter.from_config(self.config)
        self.stop: TooManyFilteredGroups | None = None

    async def _process_single_sample_streaming(self, rollout_sample) -> None:
        if self.group_filter is None:
            return await super()._process_single_sample_streaming(rollout_sample)
        # verl's method, with the filter between generation and the queue
        uid = np.array([f"uid_{rollout_sample.sample_id}"] * len(rollout_sample.full_batch), dtype=object)
        rollout_sample.full_batch.non_tensor_batch["uid"] = uid
        output = await self.async_rollout_manager.generate_sequences_single(rollout_sample.full_batch)
        output.non_tensor_batch["uid"] = uid  # verl's agent loop returns a new DataProto without it
        try:
            kept = self.group_filter.keep(output, self._completed_steps)
        except TooManyFilteredGroups as stop:
            self.stop = stop
            raise
        self.processed_sample_count += 1
        if kept is None:
            # no lock: verl's processor holds it while it waits for this task
            self.staleness_samples -= 1  # a dropped group takes no place in the staleness bound
            self.total_rollout_steps += 1  # and a fresh prompt takes its place, as dynamic sampling refills
            return None
        rollout_sample.full_batch = output
        rollout_sample.rollout_status = await self.get_statistics()
        if await self.message_queue_client.put_sample(sample=ray.cloudpickle.dumps(rollout_sample)):
            self.total_generated_samples += 1
            self._step_generated_samples += 1
        else:
            self.dropped_stale_samples += 1
        return None

    async def save_checkpoint(self, local_global_step_folder: str):
        # verl's trainer calls this before it writes its marker of a complete checkpoint
        await super().save_checkpoint(local_global_step_folder)
        if self.group_filter is not None:
            (Path(local_global_step_folder) / FILTER_STATE).write_text(json.dumps(self.group_filter.counts()))

    def load_checkpoint(self):
        loaded = super().load_checkpoint()
        folder = self._resumed_folder()
        if self.group_filter is not None and folder is not None and (folder / FILTER_STATE).is_file():
            self.group_filter.restore(json.loads((folder / FILTER_STATE).read_text()))
        return loaded

    def _resumed_folder(self) -> Path | None:
        """The global_step_N folder verl's load_checkpoint resumed from (resume_mode auto or resume_path)."""
        trainer = self.config.trainer
        if trainer.resume_mode == "resume_path":
            return Path(trainer.resume_from_path)
        if trainer.resume_mode == "auto":
            latest = find_latest_ckpt_path(str(Path(trainer.default_local_dir).absolute()))
            return Path(latest) if latest else None
        return None

    async def reset_staleness(self):
        if self.group_filter is not None:
            self.group_filter.new_step()
        return await super().reset_staleness()

    async def get_statistics(self) -> dict:
        stats = await super().get_statistics()
        return {**stats, **self.group_filter.metrics()} if self.group_filter is not None else stats

    async def fit(self) -> None:
        await super().fit()
        # verl's fit swallows its tasks' errors once it has ended the queue: the filter's stop must fail the
        # run
        if self.stop is not None:
            raise self.stop


class DAPOOneStepTaskRunner(one_step_main.OneStepTaskRunner.__ray_actor_class__):
    def run(self, config: Any) -> None:
        one_step_main.OneStepOffRayTrainer = DAPOOneStepTrainer
        super().run(config)


class DAPOFullyAsyncTaskRunner(fully_async_main.FullyAsyncTaskRunner.__ray_actor_class__):
    def _create_rollouter(self, config: Any) -> None:
        # here, not in run(): Ray ships verl's other runner methods as copies, with their own globals, and
        # only verl's method reached through super() reads the module's
        fully_async_main.FullyAsyncRollouter = as_actor_like(FullyAsyncRollouter, DAPOFullyAsyncRollouter)
        super()._create_rollouter(config)


def as_actor_like(verl_actor: Any, cls: type) -> Any:
    """`cls` as a Ray actor with the options verl gave `verl_actor` (CPUs, and the concurrency that lets the
    rollouter answer the trainer while it generates)."""
    return ray.remote(**verl_actor._default_options)(cls)


# async_mode -> (verl's entry module, the name of its task runner there, the runner that replaces it)
TASK_RUNNERS = {
    "one_step": (one_step_main, "OneStepTaskRunner", DAPOOneStepTaskRunner),
    "fully": (fully_async_main, "FullyAsyncTaskRunner", DAPOFullyAsyncTaskRunner),
}
