"""The CPU checkpoint engine of verl's async trainers (dapo_suite/train/verl/cpu_checkpoint_engine.py): verl's
own registry and manager protocol (prepare, build_topology, init_process_group, send/receive, finalize), real
ZeroMQ sockets, the trainer's rank 0 sending to two rollout workers while a second trainer rank only walks its
weights."""

from __future__ import annotations

import asyncio

import torch
from verl.checkpoint_engine.base import CheckpointEngineRegistry

from dapo_suite.train.verl.cpu_keys import CPU_CHECKPOINT_ENGINE, CPU_CHECKPOINT_ENGINE_MODULE


def test_weights_reach_every_rollout_worker_in_buckets():
    import importlib

    importlib.import_module(CPU_CHECKPOINT_ENGINE_MODULE)  # what verl's custom_backend_module hook does
    weights = {f"layer{i}.weight": torch.randn(64, 32) for i in range(5)}
    bucket = 3 * 64 * 32 * 4  # three float32 tensors a bucket: the last bucket holds the rest
    actors = [
        CheckpointEngineRegistry.new(CPU_CHECKPOINT_ENGINE, bucket_size=bucket, is_master=rank == 0)
        for rank in range(2)
    ]
    rollouts = [CheckpointEngineRegistry.new(CPU_CHECKPOINT_ENGINE, bucket_size=bucket) for _ in range(2)]
    engines = actors + rollouts
    actor_kwargs, rollout_kwargs = type(actors[0]).build_topology(2, 2, [e.prepare() for e in engines])
    for group, kwargs in ((actors, actor_kwargs), (rollouts, rollout_kwargs)):
        for rank, engine in enumerate(group):
            engine.init_process_group(**{key: values[rank] for key, values in kwargs.items()})
    walked = []

    async def receive(engine) -> dict[str, torch.Tensor]:
        return {name: weight async for name, weight in engine.receive_weights()}

    async def sync() -> list[dict[str, torch.Tensor]]:
        idle = (walked.append(name) or (name, weight) for name, weight in weights.items())
        *_, first, second = await asyncio.gather(
            actors[0].send_weights(iter(weights.items())),
            actors[1].send_weights(idle),
            receive(rollouts[0]),
            receive(rollouts[1]),
        )
        return [first, second]

    for received in asyncio.run(sync()):
        assert received.keys() == weights.keys()
        assert all(torch.equal(received[name], weights[name]) for name in weights)
    assert walked == list(weights)  # the other trainer rank produced every weight (a collective in FSDP)
    for engine in engines:
        engine.finalize()


def test_a_sync_whose_other_side_is_gone_fails_with_what_to_do_instead_of_waiting():
    """A rollout worker killed mid-run (Ray's memory monitor) left a weight sync waiting forever: each side
    now gives up after its timeout with a message, the trainer's push to a receiver nobody serves as well as a
    receive that no trainer feeds."""
    import importlib
    import socket

    import pytest

    module = importlib.import_module(CPU_CHECKPOINT_ENGINE_MODULE)
    with socket.socket() as probe:  # a port nothing listens on: the receiver is gone
        probe.bind(("127.0.0.1", 0))
        gone = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    sender = CheckpointEngineRegistry.new(
        CPU_CHECKPOINT_ENGINE, bucket_size=1 << 20, is_master=True, timeout_s=0.5
    )
    sender.init_process_group(role="send", receivers=[gone])
    with pytest.raises(
        module.WeightSyncStalled, match=f"no rollout worker at {gone} took no bucket.*--resume"
    ):
        asyncio.run(sender.send_weights(iter({"w": torch.zeros(4)}.items())))
    sender.finalize()

    receiver = CheckpointEngineRegistry.new(CPU_CHECKPOINT_ENGINE, bucket_size=1 << 20, timeout_s=0.5)
    receiver.prepare()

    async def receive() -> list:
        return [item async for item in receiver.receive_weights()]

    with pytest.raises(module.WeightSyncStalled, match="memory monitor"):
        asyncio.run(receive())
    receiver.finalize()
