"""What made a run: the package version and the git revision it ran from, and the machine (CPU, the vector
extensions that pick the kernels, torch's thread count, the GPU when one is visible). Every run directory
records them (the trainer's config.yaml, the evaluator's and the data build's config.json), so a figure can be
traced to its code, and a seed's numbers to what they depend on beside it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from dapo_suite import __version__

# Keys a run's saved config carries beside its fields; a config read back as input (a run's config.yaml as a
# preset, a build's config.json as --config) skips them.
PROVENANCE_KEYS = ("version", "git_rev", "machine", "torch_threads", "accelerator")
# The CPU features that choose the sampler's kernels and the precisions `auto` resolves to.
VECTOR_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_description() -> str:
    """ "<CPU model> (family F model M), <N> cores, flags <the VECTOR_FLAGS it has>" (from /proc/cpuinfo;
    "unknown" elsewhere). The family and model tell CPU generations apart where the model name does not (a
    cloud VM's "AMD EPYC" is Zen 4 as family 25, Zen 5 as family 26)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        info = ""
    model = re.search(r"model name\s*:\s*(.*)", info)
    flags = set(flags_line[1].split()) if (flags_line := re.search(r"flags\s*:\s*(.*)", info)) else set()
    vector = [flag for flag in VECTOR_FLAGS if flag in flags]
    family, number = (
        re.search(r"cpu family\s*:\s*(\d+)", info),
        re.search(r"^model\s*:\s*(\d+)", info, re.MULTILINE),
    )
    generation = f" (family {family[1]} model {number[1]})" if family and number else ""
    return (
        f"{model[1] if model else 'unknown'}{generation}, {os.cpu_count()} cores, "
        f"flags {' '.join(vector) or 'none'}"
    )


def cpu_line() -> str:
    """ "CPU: <cpu_description()>; load average <1, 5 and 15 minutes>": what every benchmark writes into its
    output (first and last in printed text, `cpu` in JSON), so each figure names the machine it ran on and how
    busy it was."""
    load = os.getloadavg()
    return f"CPU: {cpu_description()}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"


def provenance() -> dict[str, str | int | None]:
    """{"version": the package version, "git_rev": HEAD of the git checkout holding this package, or None when
    it is not in one (an installed wheel) or git is missing, "machine": cpu_description(), "torch_threads":
    torch's intra-op thread count when torch is loaded (it sets the order of reductions, so a seed's exact
    numbers depend on it), else None, "accelerator": the CUDA device's name when torch is loaded and sees one
    (a run on it names the GPU as well as the host's CPU), else None}."""
    try:
        git_rev = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"],
                capture_output=True,
                text=True,
                timeout=5,
                check=True,
                cwd=Path(__file__).parent,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        git_rev = None
    torch = sys.modules.get("torch")  # not imported for this: a data build does not load torch
    return {
        "version": __version__,
        "git_rev": git_rev,
        "machine": cpu_description(),
        "torch_threads": torch.get_num_threads() if torch else None,
        "accelerator": torch.cuda.get_device_name() if torch and torch.cuda.is_available() else None,
    }
