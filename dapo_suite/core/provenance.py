"""What made a run: the package version and the git revision it ran from. Every run directory records them (the
trainer's config.yaml, the evaluator's and the data build's config.json), so a figure can be traced to its code."""

from __future__ import annotations

import subprocess
from pathlib import Path

from dapo_suite import __version__

# Keys a run's saved config carries beside its fields; a config read back as input (a run's config.yaml as a
# preset, a build's config.json as --config) skips them.
PROVENANCE_KEYS = ("version", "git_rev")


def provenance() -> dict[str, str | None]:
    """{"version": the package version, "git_rev": HEAD of the git checkout holding this package, or None when it
    is not in one (an installed wheel) or git is missing}."""
    try:
        git_rev = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True,
                                 cwd=Path(__file__).parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        git_rev = None
    return {"version": __version__, "git_rev": git_rev}
