"""One writer per output folder: a stage holds `OUT/.dapo-suite.lock` while it writes there.

Two `data build` (or `train`, `eval`, `demo`) runs into one folder would interleave their files and both exit
0. The lock is an advisory `flock` on a file that records who holds it (pid, host, command, start time), so:
- a second writer is refused at once, with a message naming the process that holds the folder;
- a lock left by a process that died (kill -9, a crash, a reboot) is not held by anyone: the kernel releases a
  flock with its process, so the next writer takes it over and says whose it was.
flock works within one machine (and on most network file systems); the recorded host makes a clash across
machines readable rather than silent.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dapo_suite.core.errors import UserError

LOCK_FILE = ".dapo-suite.lock"


class FolderBusy(UserError):
    """Another live process writes to the folder; `holder` says which."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


def _holder(text: str) -> dict:
    try:
        return json.loads(text)
    except ValueError:
        return {}


@contextmanager
def output_lock(
    folder: str | Path, flag: str = "--out", warn=None, wait_seconds: float = 0.0
) -> Iterator[Path]:
    """Hold the lock on `folder` (created if missing) for the block; `warn(message)` hears a stale lock's
    takeover (default: stderr). Raises FolderBusy, naming the other process, when a live process holds it (for
    longer than `wait_seconds`: a wait suits locks that are held for moments, such as a shared file's
    rewrite)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    handle = open(path, "a+")  # noqa: SIM115 (held open for the block: closing releases the lock)
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < deadline:
                    time.sleep(0.1)
                    continue
                handle.seek(0)
                other = _holder(handle.read())
                who = (
                    (
                        f"pid {other.get('pid', '?')} on {other.get('host', '?')}, started "
                        f"{other.get('started', '?')}: `{other.get('command', '?')}`"
                    )
                    if other
                    else "another process"
                )
                raise FolderBusy(
                    f"{flag} {folder}: another dapo-suite process is writing there ({who}). Wait for "
                    f"it to finish, stop it, or pick another {flag}.",
                    who,
                ) from None
        handle.seek(0)
        previous = _holder(handle.read())
        if previous:
            message = (
                f"{flag} {folder}: taking over the lock of pid {previous.get('pid', '?')} "
                f"(`{previous.get('command', '?')}`, started {previous.get('started', '?')}), which is no "
                f"longer running; its files are kept and resumed where the stage allows"
            )
            (warn or (lambda text: print(f"warning: {text}", file=sys.stderr)))(message)
        handle.seek(0)
        handle.truncate()
        handle.write(
            json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                    "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                }
            )
        )
        handle.flush()
        try:
            yield folder
        finally:  # released (an error included): only a killed process leaves its record for the next writer
            handle.seek(0)
            handle.truncate()
    finally:
        handle.close()
