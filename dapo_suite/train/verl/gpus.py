"""GPU arithmetic of a verl run: how a batch splits over the GPUs, and how many GPUs a model's training needs.

`layout_problems` is the split verl would only find wrong on the cluster (validate.resource_problems reports
it). `gpus_needed` is the fewest GPUs on which that split holds and each GPU holds its share of the model:
FSDP shards the training state over every GPU (verl keeps float32 weights: 16 bytes per trained parameter with
its gradient and AdamW's two moments, 4 per frozen one), and vLLM keeps a bf16 copy of the weights split over
its tensor-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass

from dapo_suite.train.config import TrainConfig
from dapo_suite.train.verl.keys import ASYNC_TRAINERS, Hardware, VerlConfigError, split_gpus

GPU_BYTES = 80 * 10**9  # an 80 GB GPU (A100, H100, H800: the paper's kind)
GPU_SHARE = 0.8  # of a GPU, for the model's shards; the rest holds activations and vLLM's KV cache
GPUS_PER_NODE = 8  # the recipe's node
MAX_NODES = 64
TRAINED_BYTES, FROZEN_BYTES, ROLLOUT_BYTES = 16, 4, 2  # per parameter (see the module docstring)


def layout_problems(
    train: Hardware, rollout: Hardware, tp: int, sp: int, batch: int, mini: int, n: int
) -> list[str]:
    """How `batch` prompts (`mini` per update) x `n` responses fail to split over the GPUs that train
    (`train`, Ulysses size `sp`) and those that generate (`rollout`, tensor-parallel size `tp`); empty when
    they split."""
    problems = []
    if rollout.gpus_per_node % tp:
        problems.append(
            f"rollout tensor parallel size {tp} must divide the GPUs per node that generate "
            f"({rollout.gpus_per_node}): set --tp to a divisor"
        )
    if train.gpus % sp:
        problems.append(
            f"Ulysses sequence parallel size {sp} must divide the number of GPUs ({train.gpus}): set --sp"
        )
    if problems:
        return problems
    dp = train.gpus // sp
    if mini > batch:
        problems.append(
            f"mini-batch ({mini} prompts) is larger than the batch ({batch} prompts): lower mini_batch_size"
        )
    if (batch * n) % train.gpus:
        problems.append(
            f"batch of {batch} prompts x {n} responses = {batch * n} is not divisible by the "
            f"{train.gpus} GPUs (verl splits responses evenly): change train_batch_size or group_size"
        )
    if (mini * n) % dp:
        problems.append(
            f"mini-batch of {mini} prompts x {n} responses = {mini * n} is not divisible by the "
            f"data-parallel size {dp} (= {train.gpus} GPUs / SP {sp}): change mini_batch_size"
        )
    return problems


@dataclass(frozen=True)
class GpuPlan:
    """A layout verl can run a model on, and what each of its GPUs holds."""

    hardware: Hardware
    state_per_gpu: int  # the FSDP shard of weights, gradients and AdamW state
    rollout_per_gpu: int  # vLLM's bf16 weights over its tensor-parallel group

    @property
    def flags(self) -> list[str]:
        """The `dapo-suite train` flags that ask for this layout."""
        nodes = ["--nnodes", str(self.hardware.nnodes)] if self.hardware.nnodes > 1 else []
        return [*nodes, "--gpus-per-node", str(self.hardware.gpus_per_node)]

    def describe(self) -> str:
        return (
            f"{self.hardware.gpus} GPUs of {GPU_BYTES / 1e9:.0f} GB, each holding "
            f"{self.state_per_gpu / 2**30:,.1f} GiB of sharded weights, gradients and AdamW state and "
            f"{self.rollout_per_gpu / 2**30:,.1f} GiB of vLLM's weights"
        )


def _layouts(gpus_per_node: int):
    """Candidate layouts, fewest GPUs first: one node of 1, 2, 4 ... GPUs, then whole nodes."""
    size = 1
    while size < gpus_per_node:
        yield Hardware(nnodes=1, gpus_per_node=size)
        size *= 2
    for nodes in range(1, MAX_NODES + 1):
        yield Hardware(nnodes=nodes, gpus_per_node=gpus_per_node)


def gpus_needed(
    config: TrainConfig, frozen: int, trained: int, gpus_per_node: int = GPUS_PER_NODE
) -> GpuPlan | None:
    """The fewest GPUs verl trains `config` on, for a model of `frozen` + `trained` parameters (trained: all
    of them in full fine-tuning, the adapters with LoRA), with the recipe's tensor and sequence parallel sizes
    (`Hardware.tp`, `Hardware.sp`) and an async run's default split; None beyond MAX_NODES nodes."""
    state = FROZEN_BYTES * frozen + TRAINED_BYTES * trained
    weights = ROLLOUT_BYTES * (frozen + trained)
    for hw in _layouts(gpus_per_node):
        try:  # an async run trains on part of the GPUs (keys.split_gpus)
            train, rollout = split_gpus(hw) if config.async_mode in ASYNC_TRAINERS else (hw, hw)
        except VerlConfigError:
            continue
        if layout_problems(
            train, rollout, hw.tp, hw.sp, config.train_batch_size, config.mini_batch_size, config.group_size
        ):
            continue
        plan = GpuPlan(hw, -(-state // train.gpus), -(-weights // hw.tp))
        if plan.state_per_gpu + plan.rollout_per_gpu <= GPU_SHARE * GPU_BYTES:
            return plan
    return None
