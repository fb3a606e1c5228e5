"""Weight sync for verl's async trainers on a CPU: a checkpoint engine in verl's own registry, over ZeroMQ.

verl's one-step and fully async trainers generate on servers of their own and, after an update, stream the
trainer's weights to them through a checkpoint engine (`verl.checkpoint_engine`). verl 0.9.1's engines for
that are GPU or RDMA transports (nccl and nixl need cupy and CUDA, hccl an NPU, mooncake and kimi RDMA); its
one CPU engine, "naive", only hands weights over inside one process (trainer and rollout colocated). This
engine sends them from the trainer's rank 0 to every rollout worker over ZeroMQ (TCP, one PUSH socket per
receiver, buckets of `bucket_size` bytes); the rollout worker then loads them into vLLM as in a colocated sync
(`cpu_rollout`).

verl imports it where it builds engines, through its hook for engine plugins
(`actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module`; `cpu_keys.cpu_overrides` sets it for
async runs).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Awaitable, Generator
from typing import Any

import ray
import torch
import zmq
import zmq.asyncio
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry

from dapo_suite.train.verl.cpu_keys import CPU_CHECKPOINT_ENGINE

SEND, IDLE, RECEIVE = "send", "idle", "receive"
# A bucket not taken or not arriving in this long means the other side is gone (a rollout server killed by
# Ray's memory monitor, a dead trainer): the run fails with what to do instead of waiting forever.
SYNC_TIMEOUT_S = 600.0


class WeightSyncStalled(RuntimeError):
    """A bucket of weights was neither taken nor delivered within the engine's timeout."""


@CheckpointEngineRegistry.register(CPU_CHECKPOINT_ENGINE)
class ZMQCheckpointEngine(CheckpointEngine):
    """verl's checkpoint engine interface: the trainer's rank 0 sends, the other trainer ranks only produce
    their share of each weight (gathering a weight is collective over them), every rollout worker receives."""

    def __init__(self, bucket_size: int, is_master: bool = False, timeout_s: float = SYNC_TIMEOUT_S) -> None:
        self.bucket_size = bucket_size
        self.is_master = is_master
        self.timeout_s = timeout_s
        self.context = zmq.asyncio.Context.instance()
        self.sockets: list[zmq.asyncio.Socket] = []
        self.addresses: list[str] = []
        self.role = SEND if is_master else RECEIVE

    def prepare(self) -> str | None:
        """Every worker but the sender binds a socket on a free port and reports its address."""
        if self.is_master:
            return None
        socket = self.context.socket(zmq.PULL)
        host = ray.util.get_node_ip_address().strip("[]")
        port = socket.bind_to_random_port(f"tcp://{host}")
        self.sockets, self.addresses = [socket], [f"tcp://{host}:{port}"]
        return self.addresses[0]

    @classmethod
    def build_topology(
        cls, actor_wg_world_size: int, rollout_world_size: int, metadata: list
    ) -> tuple[dict, dict]:
        receivers = metadata[actor_wg_world_size:]
        actor = {
            "role": [SEND] + [IDLE] * (actor_wg_world_size - 1),
            "receivers": [receivers] * actor_wg_world_size,
        }
        rollout = {"role": [RECEIVE] * rollout_world_size, "receivers": [[]] * rollout_world_size}
        return actor, rollout

    def init_process_group(self, role: str, receivers: list[str]) -> None:
        self.role = role
        if role == IDLE:
            self.finalize()
        elif role == SEND:
            self.sockets = [self.context.socket(zmq.PUSH) for _ in receivers]
            self.addresses = list(receivers)
            for socket, address in zip(self.sockets, receivers, strict=True):
                socket.setsockopt(
                    zmq.IMMEDIATE, 1
                )  # queue only to a live receiver: a dead one blocks, then times out
                socket.connect(address)

    def finalize(self) -> None:
        """verl calls it once every receiver has its weights: nothing is left in flight."""
        for socket in self.sockets:
            socket.close(linger=0)
        self.sockets = []

    async def send_weights(
        self, weights: Generator[tuple[str, torch.Tensor], None, None], global_steps: int | None = None
    ) -> None:
        if self.role != SEND:
            for _ in weights:
                pass
            return
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, weight in weights:
            bucket.append((name, weight.detach().to("cpu", copy=True)))
            size += weight.numel() * weight.element_size()
            if size >= self.bucket_size:
                await self._send(bucket, last=False)
                bucket, size = [], 0
        await self._send(bucket, last=True)

    async def _send(self, bucket: list[tuple[str, torch.Tensor]], last: bool) -> None:
        for socket, address in zip(self.sockets, self.addresses, strict=True):
            await self._within_timeout(
                socket.send_pyobj((bucket, last)), f"no rollout worker at {address} took"
            )

    async def receive_weights(
        self, global_steps: int | None = None
    ) -> AsyncGenerator[tuple[str, torch.Tensor]]:
        (socket,), (address,) = self.sockets, self.addresses
        last = False
        while not last:
            bucket, last = await self._within_timeout(
                socket.recv_pyobj(), f"the rollout worker at {address} got"
            )
            for name, weight in bucket:
                yield name, weight

    async def _within_timeout(self, transfer: Awaitable[Any], what: str) -> Any:
        try:
            return await asyncio.wait_for(transfer, self.timeout_s)
        except TimeoutError:
            raise WeightSyncStalled(
                f"weight sync stalled: {what} no bucket of weights in {self.timeout_s:.0f} s. The other side "
                f"is gone: look in the run's log for a process Ray killed (its memory monitor, when the "
                f"machine runs out of memory), free memory or lower the rollout's, and continue with --resume"
            ) from None
