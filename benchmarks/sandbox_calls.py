"""Sandbox calls a second: dapo-suite's sandbox (warm pool, and a fresh worker a call) against a bare
subprocess with no isolation at all (SkyRL's Python tool: `subprocess.run(["python", "-c", code])` with a
timeout), in one run.

    .venv/bin/python -m benchmarks.sandbox_calls [--calls 200] [--out docs/results/sandbox/calls.txt]

Each way runs the same calls (a print, and a numpy import) with 1 caller and with as many callers as cores,
and prints calls/s and the ratio to the bare subprocess at the same concurrency: the bare process is the floor
of process start-up here (the cost of isolation is what the sandbox adds to it). Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from dapo_suite.core.provenance import provenance
from dapo_suite.core.sandbox import Sandbox

CODES = {"print": "print(237 + 574)", "numpy": "import numpy as np\nprint(int(np.arange(5).sum()))"}


def bare_run(code: str) -> str:
    """SkyRL's way: a fresh interpreter, a timeout, nothing else."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=10).stdout


def rate(call, code: str, calls: int, callers: int) -> float:
    """Calls a second of `call(code)` from `callers` threads, after a few untimed calls."""
    with ThreadPoolExecutor(callers) as pool:
        list(pool.map(call, [code] * 2 * callers))
        start = time.perf_counter()
        outputs = list(pool.map(call, [code] * calls))
        elapsed = time.perf_counter() - start
    if not all(outputs):
        raise RuntimeError("a call printed nothing")
    return calls / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, help="also write the table here")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    lines = [
        f"# {provenance()['machine']}; {args.calls} calls a cell; python -m benchmarks.sandbox_calls",
        "code    callers  bare subprocess/s  sandbox, pool/s (x bare)  sandbox, fresh worker/s (x bare)",
    ]
    print(lines[0], flush=True)
    for name, code in CODES.items():
        for callers in sorted({1, cores}):
            bare = rate(bare_run, code, args.calls, callers)
            with Sandbox(pool_size=callers) as pooled:
                warm = rate(lambda c: pooled.run(c).stdout, code, args.calls, callers)
            with Sandbox(pool_size=0) as fresh:
                cold = rate(lambda c: fresh.run(c).stdout, code, args.calls, callers)
            lines.append(
                f"{name:7} {callers:7}  {bare:17.1f}  {warm:14.1f} ({warm / bare:4.2f}x)  "
                f"{cold:19.1f} ({cold / bare:4.2f}x)"
            )
            print(lines[-1], flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
