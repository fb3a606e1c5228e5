"""The decode step's fused CPU kernels (`csrc/`: a source per kernel family), built on first use, in bfloat16
and float32.

Between its four projections, a bf16 decode step of the embedded model ran ~20 small tensor ops per layer
(RoPE, cache writes, attention, residual adds, RMSNorm, casts, SiLU x up), each a dispatch and a pass over
memory. The kernels do the same arithmetic in four calls per layer: `attend` (RoPE, cache write and
grouped-query attention over each row's valid cache positions, skipping left padding; also the packed prompt
pass, one query per token), `add_rms_norm` (twice) and `silu_mul`, all run with the projections by one call
per step (`run_layers`). The projections are the module's own `linear` over weights packed once
(`pack_weight`, blocks of 48 outputs in bf16 pair order), faster than oneDNN's linear at a decode step's rows
(benchmarks/projections.py, docs/benchmarks.md). On a CPU with AMX, `linear` runs 8-64 rows through the tile
unit on the same packed weight (`TILE_MIN_ROWS`) and more rows through oneDNN's AMX matmul
(`ONEDNN_MIN_ROWS`). `decoding.LeanStepper` uses them for bfloat16 on a CPU with avx512_bf16 (`NATIVE_BF16`:
attention and `linear` use its pair dot products; built without it, bf16 decodes with torch's ops) and for
float32 on every CPU: the float32 kernels are written with GCC/Clang vector types, which the compiler maps to
the CPU's widest vectors (`FLOAT32_VECTORS`: avx512, avx2, avx, neon or sse), and `linear`'s tile is sized to
its register file. Their float32 samples are transformers' for a seed (tests/inference/test_sampler.py).
`sample_next` draws the next tokens (temperature, top-p) for `sampling.sample_tokens` in every dtype on a CPU.

The extension is compiled by torch.utils.cpp_extension (g++ or clang, and ninja) into torch's extension cache
(once per machine and source version), for the CPU it runs on (-march=native; $DAPO_SUITE_KERNEL_ARCH
names another target, e.g. `x86-64-v3` for an AVX2-only build on a newer CPU). Where it cannot be built,
`kernels()` warns with the cause and returns None, and the stepper decodes with torch's ops (slower, same
samples up to rounding).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import shutil
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
SOURCES = sorted(CSRC.glob("*.cpp"))  # one per kernel family, sharing csrc/kernels.h
# -ffast-math lets the compiler vectorise exp (glibc's libmvec) and the float reductions; it is given to the
# compile step only, so the linker does not set flush-to-zero for the whole process. -march=native: the kernel
# is built where it runs.
CFLAGS = ["-O3", "-march=native", "-mprefer-vector-width=512", "-ffast-math", "-fopenmp"]
ARCH_VARIABLE = "DAPO_SUITE_KERNEL_ARCH"


def build_flags() -> tuple[str, list[str]]:
    """(the -march target, the compile flags): -march=native, or the target $DAPO_SUITE_KERNEL_ARCH names."""
    arch = os.environ.get(ARCH_VARIABLE, "").strip() or "native"
    return arch, [f"-march={arch}" if flag.startswith("-march=") else flag for flag in CFLAGS]


def cpu_tag() -> str:
    """A short tag of this CPU's instruction sets: the build is -march=native, so machines sharing one home
    directory (and torch's extension cache in it) each get their own."""
    try:
        flags = next(
            line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")
        )
    except (OSError, StopIteration):
        return "generic"
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


# far longer than a build takes, even on a busy machine: a lock this old was left by a killed one
STALE_LOCK_SECONDS = 600


def clear_stale_lock(lock: Path) -> None:
    """Remove torch's build lock when it is older than STALE_LOCK_SECONDS: a process killed while it compiled
    the extension leaves the lock behind, and every later `cpp_extension.load` then waits on it forever."""
    import time

    try:
        age = time.time() - lock.stat().st_mtime
    except OSError:
        return  # no lock: nothing to do
    if age > STALE_LOCK_SECONDS:
        warnings.warn(
            f"removing a stale build lock ({lock}, {age / 60:.0f} minutes old: a build was killed)",
            stacklevel=3,
        )
        lock.unlink(missing_ok=True)


@contextlib.contextmanager
def waiting_on_lock(lock: Path, poll_seconds: float = 10.0) -> Iterator[None]:
    """While torch waits on another process's build lock (it waits forever), say so once, and remove the lock
    when it turns stale. Watches only a lock that was there before this process started: never its own
    build's."""
    if not lock.exists():
        yield
        return
    warnings.warn(
        f"waiting for another process's build of the sampler's kernels ({lock}); a lock left by a killed "
        f"build is removed {STALE_LOCK_SECONDS // 60} minutes after it was made",
        stacklevel=3,
    )
    done = threading.Event()

    def watch() -> None:
        while lock.exists() and not done.wait(poll_seconds):
            clear_stale_lock(lock)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()


def source_hash() -> str:
    """A short hash of every file in csrc/ (the sources and their shared header)."""
    digest = hashlib.sha1()
    for path in sorted(CSRC.iterdir()):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:8]


@functools.cache
def kernels():
    """The compiled extension module (`run_layers`, `attend`, `add_rms_norm`, `silu_mul`, `linear`,
    `pack_weight`, `sample_next`; `NATIVE_BF16`, `FLOAT32_VECTORS`), or None where it cannot be built."""
    try:
        from torch.utils import cpp_extension

        if (
            shutil.which("ninja") is None
        ):  # pip's ninja sits beside the venv's python, off PATH unless activated
            import ninja

            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
        arch, flags = build_flags()
        # The sources' hash in the name: two checkouts of different versions on one machine (a fresh clone
        # beside a working tree) build in folders of their own instead of rebuilding over each other under one
        # lock.
        source_tag = source_hash()
        name = f"dapo_decode_step_{cpu_tag()}_{source_tag}" + (
            "" if arch == "native" else "_" + re.sub(r"\W", "_", arch)
        )
        lock = Path(cpp_extension._get_build_directory(name, verbose=False)) / "lock"
        clear_stale_lock(lock)
        with waiting_on_lock(lock):
            return cpp_extension.load(
                name=name,
                sources=[str(path) for path in SOURCES],
                extra_cflags=flags,
                extra_ldflags=["-fopenmp"],
            )
    except (OSError, RuntimeError, ImportError) as error:  # no compiler, no ninja, a failed build
        first_line = (str(error).strip().splitlines() or [""])[0]
        target = "" if build_flags()[0] == "native" else f" for ${ARCH_VARIABLE}={build_flags()[0]}"
        warnings.warn(
            f"fused decode kernels unavailable{target} ({type(error).__name__}: {first_line}); decoding with "
            "torch's ops, which are slower. A C++ compiler (g++ or clang) and `pip install ninja` "
            "enable them.",
            stacklevel=2,
        )
        return None
