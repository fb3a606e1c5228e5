"""The threads the sampler runs on: the cores this process may use, less those other programs keep busy.

OpenMP threads wait for each other at the end of every parallel region, and a decode step has hundreds. When
one of two threads shares its core with another program, every region waits for that thread's next time slice,
so a neighbour slows sampling far more than the share of the machine it takes, and one thread on a free core
is faster than two (docs/results/vs-vllm/README.md, "Beside another program"). So the sampler watches the
cores (`FreeCores.adapt`, twice a second): the CPU time the machine spent on its cores less this process's own
is the other programs' load, and each core they keep at least a third busy is left to them, down to one
thread.

A run that sets its thread count (`DAPO_SUITE_THREADS` or `OMP_NUM_THREADS`) keeps it: what a run that must
repeat bit for bit does. The sampler's tokens do not depend on the thread count (each output sums on one
thread); the trainer's update, which this leaves alone, does.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

THREADS_VARIABLE = "DAPO_SUITE_THREADS"
# how often the load is read: reading /proc/stat is cheap next to the decode steps in between
CHECK_SECONDS = 0.5
TAKEN_SHARE = (
    1 / 3
)  # another program using this much of a core takes that core: a thread there would wait on it
# a sampling block this soon after the last one starts at the thread count that one ended with
KEEP_SECONDS = 5.0


def usable_cores() -> set[int]:
    """The cores this process may run on (its affinity, as `taskset` sets it; every core where the OS has
    none)."""
    return os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def fixed_threads() -> int | None:
    """The thread count the user set ($DAPO_SUITE_THREADS, else $OMP_NUM_THREADS), or None."""
    for variable in (THREADS_VARIABLE, "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").strip()
        if value:
            try:
                return max(1, int(value.split(",")[0]))
            except ValueError:
                continue
    return None


def busy_seconds(cores: set[int], stat: Path = Path("/proc/stat")) -> float | None:
    """CPU seconds the machine has spent busy (not idle or waiting on I/O) on `cores` since boot; None off
    Linux."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    ticks = 0
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cores:
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            ticks += sum(values) - values[3] - values[4]
    return ticks / os.sysconf("SC_CLK_TCK")


def threads_for(cores: int, others: float) -> int:
    """Threads to run on `cores` usable cores beside `others` cores' worth of other programs' load: each core
    they keep at least TAKEN_SHARE busy is theirs, and one thread is the least."""
    taken = math.floor(others + 1 - TAKEN_SHARE) if others >= TAKEN_SHARE else 0
    return max(1, cores - taken)


class FreeCores:
    """Adapts torch's thread count to the cores other programs leave free, for the length of a `sampling`
    block."""

    def __init__(self) -> None:
        self.cores = usable_cores()
        # (wall, machine busy, own CPU) at the last reading
        self.last: tuple[float, float, float] | None = None
        # the last reading asked for more threads: the next must too (the load may come in bursts)
        self.rising = False
        self.threads: int | None = None  # the count the last block ended with

    def read(self) -> tuple[float, float, float] | None:
        busy = busy_seconds(self.cores)
        return None if busy is None else (time.monotonic(), busy, time.process_time())

    def others(self, now: tuple[float, float, float]) -> float:
        """Cores' worth of load by other programs between the last reading and `now`."""
        wall, busy, own = (b - a for a, b in zip(self.last, now, strict=True))
        return max(0.0, (busy - own) / wall) if wall > 0 else 0.0

    def adapt(self) -> None:
        """Set torch's threads for the load of the last CHECK_SECONDS (at most once per CHECK_SECONDS)."""
        import torch

        if self.last is not None and time.monotonic() - self.last[0] < CHECK_SECONDS:
            return  # the clock first: /proc/stat costs ~0.1 ms a read, ~1 % of an 8-row decode step
        now = self.read()
        if now is None:
            return
        if self.last is not None:
            current = torch.get_num_threads()
            wanted = threads_for(len(self.cores), self.others(now))
            if wanted > current and not self.rising:
                self.rising, wanted = True, current
            else:
                self.rising = False
            if wanted != current:
                torch.set_num_threads(wanted)
        self.last = now

    @contextlib.contextmanager
    def sampling(self) -> Iterator[FreeCores | None]:
        """A block of sampling that calls `adapt` between its steps; torch's thread count is restored after
        it. Yields None (adapt nothing) when the user fixed the thread count."""
        if fixed_threads() is not None:
            yield None
            return
        import torch

        before = torch.get_num_threads()
        if self.last is not None and self.threads and time.monotonic() - self.last[0] < KEEP_SECONDS:
            torch.set_num_threads(self.threads)  # the load of a moment ago: eval's batches follow each other
        else:
            self.last, self.rising = None, False
        self.adapt()
        try:
            yield self
        finally:
            self.threads = torch.get_num_threads()
            torch.set_num_threads(before)


free_cores = FreeCores()  # one per process: the sampler's blocks share what they learned of the load
