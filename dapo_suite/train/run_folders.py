"""The folders a ladder or a study trains into: OUT/ladder_plan.json (the presets, seeds and shared overrides)
and one run folder per (rung, seed), OUT/<rung>/seed-<s>/.

Below the runner (`ladder.py`) and the report (`ladder_report.py`); `effects.py`, `workers.py` and `report.py`
find runs through it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dapo_suite.core.errors import UserError

PLAN_FILE = "ladder_plan.json"
SHARED_FILE_WAIT = 120.0  # seconds a worker waits for another to finish writing the plan or the table


def rung_name(preset: str) -> str:
    """A preset's name, or a YAML path's stem: the rung's directory and its label."""
    return Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset


def run_path(out: Path, rung: str, seed: int) -> Path:
    return out / rung / f"seed-{seed}"


def write_plan(out: Path, plan: dict[str, Any]) -> None:
    """Write OUT's plan; a plan already there must have the same overrides and scale (the runs would not be
    comparable otherwise), and its presets and seeds are kept: this command's are added to them, so a worker
    given a subset of the rungs, or a rerun with more seeds, extends the ladder."""
    plan_path = out / PLAN_FILE
    if plan_path.is_file():
        earlier = json.loads(plan_path.read_text())
        if earlier.get("scale") != plan.get("scale"):
            raise UserError(
                f"{out} holds a ladder trained with --scale {earlier.get('scale')}, this command "
                f"asks for {plan.get('scale')}: repeat the same --scale, or pick another --out"
            )
        if earlier["overrides"] != plan["overrides"]:
            raise UserError(
                f"{out} holds a ladder trained with {earlier['overrides'] or 'no overrides'}, this "
                f"command asks for {plan['overrides'] or 'none'}: repeat the same "
                "--max-steps/--model/--set, or pick another --out"
            )
        plan = {
            **plan,
            "presets": list(dict.fromkeys([*earlier["presets"], *plan["presets"]])),
            "seeds": sorted({*earlier["seeds"], *plan["seeds"]}),
        }
    plan_path.write_text(json.dumps(plan, indent=2) + "\n")


def run_finished(run_dir: Path) -> bool:
    """Whether a run has its held-out evaluation after training (summary.json's "after"): a finished run."""
    try:
        return "after" in json.loads((run_dir / "summary.json").read_text())
    except (OSError, ValueError):  # not written yet, or being written by a worker right now
        return False


def read_plan(out: Path) -> dict[str, Any]:
    plan_path = out / PLAN_FILE
    if not plan_path.is_file():
        raise UserError(f"--out {out}: no {PLAN_FILE}: is it the --out of `dapo-suite train ladder`?")
    return json.loads(plan_path.read_text())
