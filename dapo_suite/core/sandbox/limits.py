"""The sandbox's limits and the record of one call (`RunResult`), with what the model is shown of it."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dapo_suite.core.errors import UserError

MIN_MEMORY_MB = 256  # the interpreter with numpy and sympy imported takes about 135 MB of address space


@dataclass(frozen=True)
class SandboxLimits:
    """What one call may use. Defaults follow SandboxFusion's as ReTool ran it (1 GB), with a short wall time:
    a tool call inside a rollout that runs for seconds holds up the whole batch."""

    wall_seconds: float = 5.0  # from the code's arrival to its exit, then the process tree is killed
    cpu_seconds: float = 5.0  # RLIMIT_CPU of the call, on top of the worker's start-up
    memory_mb: int = 1024  # RLIMIT_AS: the whole address space of the call
    file_size_mb: int = 16  # RLIMIT_FSIZE: the largest file it may write
    tmp_mb: int = 64  # size of its private /tmp (a tmpfs)
    output_bytes: int = 65536  # of stdout and of stderr each; past it the call is killed

    def __post_init__(self) -> None:
        for name in ("wall_seconds", "cpu_seconds"):
            if not getattr(self, name) > 0:
                raise UserError(f"sandbox {name} must be > 0, got {getattr(self, name)}")
        if self.memory_mb < MIN_MEMORY_MB:
            raise UserError(
                f"sandbox memory_mb must be >= {MIN_MEMORY_MB} (the interpreter with numpy and sympy "
                f"takes about 135 MB), got {self.memory_mb}"
            )
        for name in ("file_size_mb", "tmp_mb", "output_bytes"):
            if getattr(self, name) < 1:
                raise UserError(f"sandbox {name} must be >= 1, got {getattr(self, name)}")


# outcome -> SandboxFusion's run_result status (its client and verl tool configs read that)
OUTCOMES = {
    "ok": "Finished",  # exit status 0
    "error": "Finished",  # an exception or a non-zero exit: the traceback is in stderr
    "timeout": "TimeLimitExceeded",  # wall time
    "cpu_limit": "TimeLimitExceeded",  # CPU time (SIGXCPU)
    "memory_limit": "Finished",  # MemoryError: the address-space limit
    "output_limit": "Finished",  # stdout or stderr past output_bytes: killed, output cut
    "killed": "Finished",  # ended by a signal the sandbox did not send (its exit status says which)
    "sandbox_error": "SandboxError",  # the sandbox itself failed to start the call
}


@dataclass
class RunResult:
    """One call: how it ended (`outcome`, one of OUTCOMES), its exit status, output and wall time."""

    outcome: str
    return_code: int | None
    stdout: str
    stderr: str
    execution_time: float  # seconds from the code's arrival to the end
    message: str = ""  # which limit ended it, in words, when one did

    def as_dict(self) -> dict:
        return asdict(self)

    def model_view(self, max_chars: int | None = None, truncate_side: str = "middle") -> str:
        """What the model sees: stdout, then stderr (a traceback's last lines matter most), then the limit's
        message; cut to `max_chars` on `truncate_side` (verl's `tool_response_truncate_side`: left, right,
        middle)."""
        parts = [self.stdout.rstrip("\n"), self.stderr.rstrip("\n"), self.message]
        text = "\n".join(part for part in parts if part)
        return truncate(text, max_chars, truncate_side)


TRUNCATE_SIDES = ("left", "middle", "right")


def truncate(text: str, max_chars: int | None, side: str = "middle") -> str:
    """`text` cut to `max_chars` characters, keeping its start (`right`: the right side is cut), its end
    (`left`), or both ends (`middle`), with a marker saying how much was cut."""
    if side not in TRUNCATE_SIDES:
        raise ValueError(f"truncate side must be one of {', '.join(TRUNCATE_SIDES)}, got {side!r}")
    if max_chars is None or len(text) <= max_chars:
        return text
    marker = f"...({len(text) - max_chars} characters cut)..."
    if side == "right":
        return text[:max_chars] + marker
    if side == "left":
        return marker + text[len(text) - max_chars :]
    head = max_chars // 2
    return text[:head] + marker + text[len(text) - (max_chars - head) :]
