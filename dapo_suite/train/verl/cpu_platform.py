"""verl on a CPU: a platform for verl 0.9.1's platform registry, so `verl.trainer.main_ppo` runs with no GPU.

verl asks its platform (`verl.plugin.platform.get_platform()`) for the device name, the `torch.<device>`
module, the collective backend and the Ray resource of a worker. This module registers `cpu` in
`PlatformRegistry`; verl imports it in every process (driver and Ray workers) because the launcher sets
`VERL_USE_EXTERNAL_MODULES` to this module and `VERL_PLATFORM=cpu`
(`dapo_suite.train.verl.cpu_keys.cpu_environment`). No verl file is copied or edited.

The rollout: verl's rollout name "vllm" is registered again, in `RolloutReplicaRegistry`, as verl's own vLLM
server with a weight sync that works on vLLM-CPU (`cpu_rollout`, loaded only when a rollout starts).

Ray still places workers by "GPU" (verl's resource pools count GPUs); the launcher starts Ray with logical
GPUs (`ray_init.num_gpus`), which are only slots: nothing touches CUDA.

One patch where verl offers no hook (docs/train-at-scale.md, "verl on a CPU"): verl builds its process-group
backend as `f"cpu:gloo,{device}:{backend}"`, which for this platform is `"cpu:gloo,cpu:gloo"`, a string torch
rejects (a device named twice). `torch.distributed.init_process_group` is wrapped to pass plain `"gloo"` for
exactly that string; every other backend string goes through unchanged.
"""

from __future__ import annotations

import functools
import os
import types
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed
from verl.plugin.platform.platform_base import PlatformBase
from verl.plugin.platform.platform_manager import PlatformRegistry
from verl.workers.rollout.replica import RolloutReplicaRegistry

PLATFORM = "cpu"
DUPLICATE_GLOO = "cpu:gloo,cpu:gloo"


def _memory_info() -> tuple[int, int]:
    """(free, total) bytes of RAM, what `torch.cuda.mem_get_info` reports for a GPU."""
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def _nothing(*args: Any, **kwargs: Any) -> None:
    return None


def _zero(*args: Any, **kwargs: Any) -> int:
    return 0


def _device_module() -> types.ModuleType:
    """`torch.cpu` with the `torch.cuda` calls verl makes that it lacks: rng state (the global generator),
    memory statistics (0: there is no device allocator), cache and IPC calls (nothing to release)."""
    module = types.ModuleType("dapo_suite_cpu_device")
    for name in (
        "current_device",
        "device_count",
        "is_available",
        "synchronize",
        "current_stream",
        "stream",
        "Stream",
        "Event",
        "set_device",
        "StreamContext",
    ):
        setattr(module, name, getattr(torch.cpu, name))
    module.get_rng_state = torch.get_rng_state
    module.set_rng_state = torch.set_rng_state
    module.manual_seed = torch.manual_seed
    module.manual_seed_all = torch.manual_seed
    module.mem_get_info = lambda device=None: _memory_info()
    module.get_device_name = lambda device=None: "cpu"
    for name in ("memory_allocated", "memory_reserved", "max_memory_allocated", "max_memory_reserved"):
        setattr(module, name, _zero)
    for name in ("empty_cache", "ipc_collect", "set_per_process_memory_fraction", "reset_peak_memory_stats"):
        setattr(module, name, _nothing)
    return module


DEVICE_MODULE = _device_module()


@PlatformRegistry.register(platform=PLATFORM)
class PlatformCPU(PlatformBase):
    """The host CPU as verl's accelerator: gloo collectives, one logical "GPU" slot per worker in Ray."""

    @property
    def device_name(self) -> str:
        return "cpu"

    @property
    def vendor_name(self) -> str:
        return "cpu"

    @property
    def device_module(self) -> types.ModuleType:
        return DEVICE_MODULE

    def is_available(self) -> bool:
        return True

    def is_platform_available(self, use_smi_check: bool = False) -> bool:
        # Chosen only by name (VERL_PLATFORM=cpu): auto-detection on a GPU node must never land here.
        return False

    def current_device(self) -> torch.device:
        # verl passes this to `.to(device=...)` and FSDP; an index would mean "accelerator 0"
        return torch.device("cpu")

    def device_count(self) -> int:
        return 1

    def set_device(self, device_index: int) -> None:
        return None

    def synchronize(self, device_index: int | None = None) -> None:
        return None

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def manual_seed_all(self, seed: int) -> None:
        torch.manual_seed(seed)

    def set_allocator_settings(self, settings: str) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def get_device_capability(self, device_index: int = 0) -> tuple[int | None, int | None]:
        return None, None

    def communication_backend_name(self) -> str:
        return "gloo"

    def visible_devices_envvar(self) -> str:
        return "CUDA_VISIBLE_DEVICES"

    def ray_resource_name(self) -> str:
        return "GPU"

    def ray_noset_envvars(self) -> list[str]:
        return ["RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"]

    def is_ipc_supported(self) -> bool:
        return False

    @contextmanager
    def nvtx_range(self, msg: str):
        yield

    def profiler_start(self) -> None:
        return None

    def profiler_stop(self) -> None:
        return None

    def cudart(self) -> Any:
        return None


def _cpu_vllm_replica() -> type:
    from dapo_suite.train.verl.cpu_rollout import CPUvLLMReplica

    return CPUvLLMReplica


RolloutReplicaRegistry.register("vllm", _cpu_vllm_replica)


def _plain_gloo(init_process_group):
    @functools.wraps(init_process_group)
    def wrapper(*args: Any, **kwargs: Any):
        if kwargs.get("backend") == DUPLICATE_GLOO:
            kwargs["backend"] = "gloo"
        elif args and args[0] == DUPLICATE_GLOO:
            args = ("gloo", *args[1:])
        return init_process_group(*args, **kwargs)

    wrapper.dapo_suite_plain_gloo = True
    return wrapper


if not getattr(torch.distributed.init_process_group, "dapo_suite_plain_gloo", False):
    torch.distributed.init_process_group = _plain_gloo(torch.distributed.init_process_group)
