"""Several workers on one study folder (`train ladder` and `train effects` with --workers N): N processes of
the same command, each taking the next run no other worker holds (the ladder's claim on a run's folder), each
on a core set of its own on a CPU. On one GPU the workers share it; the CUDA MPS daemon lets their kernels run
side by side."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dapo_suite.core.errors import UserError
from dapo_suite.core.threads import usable_cores
from dapo_suite.train.run_folders import run_finished

WORKER_LOGS = "workers"  # OUT/workers/worker-<i>.log
POLL_SECONDS = 5.0

logger = logging.getLogger(__name__)


def core_sets(workers: int) -> list[set[int] | None]:
    """The cores each worker is pinned to: this process's cores split evenly (the remainder unused), or None
    for every worker when there are more workers than cores (a GPU's workers: each mostly waits on the
    device)."""
    cores = sorted(usable_cores())
    if workers > len(cores):
        return [None] * workers
    size = len(cores) // workers
    return [set(cores[index * size : (index + 1) * size]) for index in range(workers)]


def run_workers(out: Path, command: list[str], workers: int, run_dirs: list[Path]) -> None:
    """Run `dapo-suite <command> --workers 1` in `workers` processes and wait for all of them, with a progress
    bar of the command's runs (`run_dirs`) finished (`run_folders.run_finished`); their output goes to
    OUT/workers/worker-<i>.log. Ctrl-C or SIGTERM stops them all (a rerun resumes every run). A worker that
    fails is named with its log once the others are done."""
    from tqdm import tqdm

    logs = out / WORKER_LOGS
    logs.mkdir(parents=True, exist_ok=True)
    processes: list[tuple[Path, subprocess.Popen]] = []
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        for index, cores in enumerate(core_sets(workers)):
            log_path = logs / f"worker-{index}.log"
            threads = len(cores) if cores else 1
            with log_path.open("a") as log:
                log.write(
                    f"worker {index} of {workers}: cores {sorted(cores) if cores else 'any'}, {threads} "
                    f"thread(s)\n"
                )
                log.flush()
                pin = (lambda chosen=cores: os.sched_setaffinity(0, chosen)) if cores else None
                processes.append(
                    (
                        log_path,
                        subprocess.Popen(
                            [sys.executable, "-m", "dapo_suite.cli", *command, "--workers", "1"],
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                            preexec_fn=pin,
                        ),
                    )
                )
        logger.info(f"{workers} workers on {out}; their output: {logs}/worker-<i>.log")
        with tqdm(total=len(run_dirs), initial=sum(map(run_finished, run_dirs)), desc="runs finished") as bar:
            while any(process.poll() is None for _, process in processes):
                time.sleep(POLL_SECONDS)
                bar.update(sum(map(run_finished, run_dirs)) - bar.n)
    finally:
        for _, process in processes:  # stopped early (Ctrl-C, SIGTERM): the runs resume on a rerun
            if process.poll() is None:
                process.terminate()
        for _, process in processes:
            process.wait()
        signal.signal(signal.SIGTERM, previous)
    failed = [
        f"{log_path} (exit code {process.returncode})"
        for log_path, process in processes
        if process.returncode
    ]
    if failed:
        raise UserError(
            f"{len(failed)} of {workers} workers failed: {', '.join(failed)}; the runs they finished "
            "are kept, and the same command resumes the rest."
        )
