"""The CI durations table (docs/architecture.md, "CI") from the output of `bash .ci/run` (or
`../shared/tools/fresh-clone-test`): each stage's wall time, then each test file's summed test time per stage
and its slowest tests. `.ci/run` prints every test over 2 s (pytest --durations-min) and a line per stage.

    ../shared/tools/fresh-clone-test > runs/ci.log 2>&1; python scripts/ci_durations.py runs/ci.log
"""

from __future__ import annotations

import argparse
import re
from collections import defaultdict
from pathlib import Path

STAGE = re.compile(r"^== ci stage (\S+): (\d+) s$")
DURATION = re.compile(r"^(\d+\.\d+)s (setup|call|teardown)\s+(\S+?)::(\S+)")


def parse(log: str) -> tuple[dict[str, int], dict[str, dict[str, float]]]:
    """(stage -> seconds, stage -> {test id -> seconds summed over setup, call and teardown})."""
    stages: dict[str, int] = {}
    tests: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    current = "before any stage"
    for line in log.splitlines():
        if line.startswith("== ci stage ") and not STAGE.match(line):
            current = line.split()[3].rstrip(":")
        elif match := STAGE.match(line):
            stages[match.group(1)] = int(match.group(2))
        elif match := DURATION.match(line):
            tests[current][f"{match.group(3)}::{match.group(4)}"] += float(match.group(1))
    return stages, tests


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("log", type=Path)
    parser.add_argument("--top", type=int, default=3, help="slowest tests named per file")
    args = parser.parse_args()
    text = args.log.read_text(errors="replace")
    stages, tests = parse(text)
    cpu = next(
        (line for line in text.splitlines() if line.startswith("== ci stages on")), "== ci stages on ?"
    )
    print(f"{cpu[3:]}\n\n| stage | wall time |\n|---|---|")
    for stage, seconds in stages.items():
        print(f"| {stage} | {seconds // 60}:{seconds % 60:02d} |")
    print(f"| total | {sum(stages.values()) // 60}:{sum(stages.values()) % 60:02d} |")
    print("\n| stage | test file | tests over 2 s, summed (s) | slowest |\n|---|---|---|---|")
    for stage, per_test in tests.items():
        files: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for test, seconds in per_test.items():
            path, name = test.split("::", 1)
            files[path].append((seconds, name))
        for path, entries in sorted(files.items(), key=lambda item: -sum(s for s, _ in item[1])):
            entries.sort(reverse=True)
            slowest = "; ".join(f"{name} {seconds:.0f} s" for seconds, name in entries[: args.top])
            print(f"| {stage} | {path} | {sum(s for s, _ in entries):.0f} | {slowest} |")


if __name__ == "__main__":
    main()
