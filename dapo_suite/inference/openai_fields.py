"""The sampling fields of an OpenAI request, checked once for every server of the project: `n`, `temperature`,
`top_p` and `seed`, with OpenAI's bounds (temperature 0-2, top_p 0-1, n 1-128). Used by the sampler server and by
`serve api`'s front, so the two answer the same request the same way.

top_p 0 keeps only the most likely token (as OpenAI and vLLM read it: greedy), temperature 0 is greedy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MAX_CHOICES = 128  # the most choices (`n`) one request may ask for, OpenAI's own limit
BOUNDS = {"temperature": (0.0, 2.0), "top_p": (0.0, 1.0)}


class RequestFieldError(ValueError):
    """A field of the request is out of range or of the wrong type: HTTP 400 naming `param`."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class SamplingFields:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sampling_fields(body: dict) -> SamplingFields:
    """The request's sampling fields with OpenAI's defaults for those absent or null; RequestFieldError otherwise."""
    n = 1 if body.get("n") is None else body["n"]
    if not _is_int(n) or not 1 <= n <= MAX_CHOICES:
        raise RequestFieldError(f"n={n!r}: must be an integer from 1 to {MAX_CHOICES}", "n")
    values = {}
    for name, (low, high) in BOUNDS.items():
        value = body.get(name)
        value = 1.0 if value is None else value
        if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
            raise RequestFieldError(f"{name}={value!r}: must be a number from {low:g} to {high:g}", name)
        values[name] = float(value)
    seed = body.get("seed")
    if seed is not None and not _is_int(seed):
        raise RequestFieldError(f"seed={seed!r}: must be an integer", "seed")
    return SamplingFields(n=n, seed=seed, **values)
