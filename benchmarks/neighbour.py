"""Another program on the machine while a benchmark runs: what a user's laptop or a shared server has beside
it.

with neighbour("busy"):      # one process spinning (`while True`), on whatever core the scheduler gives it
with neighbour("compile"):   # gcc -O2 compiling a generated C file over and over: a build beside the run
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

NEIGHBOURS = ("none", "busy", "compile")


def _c_source(functions: int = 3000) -> str:
    return "\n".join(
        f"double f{i}(double x) {{ for (int k = 0; k < {i % 7 + 2}; k++) x = x * {i}.5 + k; return x; }}"
        for i in range(functions)
    )


@contextlib.contextmanager
def neighbour(kind: str) -> Iterator[None]:
    """Runs the `kind` neighbour (one of NEIGHBOURS) for the length of the block."""
    if kind not in NEIGHBOURS:
        raise ValueError(f"neighbour {kind!r}: one of {', '.join(NEIGHBOURS)}")
    if kind == "none":
        yield
        return
    with tempfile.TemporaryDirectory() as folder:
        if kind == "busy":
            command = [sys.executable, "-c", "while True: pass"]
        else:
            source = Path(folder) / "neighbour.c"
            source.write_text(_c_source())
            command = ["sh", "-c", f"while true; do gcc -O2 -c {source} -o {folder}/neighbour.o; done"]
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )
        try:
            yield
        finally:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
