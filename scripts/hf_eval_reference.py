"""The `hf` engine's reference for the vLLM eval test (tests/inference/test_vllm_cpu.py):
`dapo-suite eval run --engine hf` on 20 arithmetic problems, 4 samples each, the DAPO protocol (T 1.0, top_p
0.7, the DAPO prompt, 96 new tokens, float32), over ten seeds pooled (800 samples). The test then runs vLLM
alone against it: one engine's run instead of two, against a reference ten times the size of its own sample.

    python scripts/hf_eval_reference.py    # writes tests/fixtures/hf_eval_reference.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from dapo_suite.core.provenance import cpu_description
from dapo_suite.train.tasks import arithmetic_problems

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "tests" / "fixtures" / "hf_eval_reference.json"
# the protocol both engines run; the test adds --engine vllm and the problem file
EVAL_FLAGS = ["--n", "4", "--max-tokens", "96", "--dtype", "float32"]


def reference_problems() -> list[dict]:
    """Every 15th problem of the arithmetic curriculum, 20 of them: all four levels of difficulty."""
    return [{"id": p.id, "problem": p.problem, "answer": p.answer} for p in arithmetic_problems()[::15][:20]]


def eval_hf(problems: Path, seed: int, out: Path) -> dict:
    argv = [
        sys.executable,
        "-m",
        "dapo_suite.cli",
        "eval",
        "run",
        "--file",
        str(problems),
        *EVAL_FLAGS,
        "--engine",
        "hf",
        "--seed",
        str(seed),
        "--out",
        str(out),
    ]
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "results.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=REFERENCE)
    args = parser.parse_args()
    problems = reference_problems()
    per_seed = []
    with tempfile.TemporaryDirectory() as folder:
        problem_file = Path(folder) / "arithmetic.jsonl"
        problem_file.write_text("".join(json.dumps(p) + "\n" for p in problems))
        for seed in range(args.seeds):
            result = eval_hf(problem_file, seed, Path(folder) / f"seed-{seed}")
            per_seed.append(
                {
                    "seed": seed,
                    "num_samples": result["num_samples"],
                    "avg@k": result["avg@k"],
                    "format_failure_rate": result["format_failure_rate"],
                }
            )
            print(f"seed {seed}: avg@4 {result['avg@k']:.3f}, no answer {result['format_failure_rate']:.3f}")
    samples = sum(row["num_samples"] for row in per_seed)
    pooled = {
        name: sum(row[name] * row["num_samples"] for row in per_seed) / samples
        for name in ("avg@k", "format_failure_rate")
    }
    reference = {
        "command": f"python scripts/hf_eval_reference.py --seeds {args.seeds}",
        "eval_flags": EVAL_FLAGS,
        "engine": "hf",
        "num_samples": samples,
        **pooled,
        "per_seed": per_seed,
        "cpu": cpu_description(),
        "date": datetime.date.today().isoformat(),
        "problems": problems,
    }
    args.out.write_text(json.dumps(reference, indent=1) + "\n")
    print(
        f"pooled over {samples} samples: avg@4 {pooled['avg@k']:.3f}, "
        f"no answer {pooled['format_failure_rate']:.3f} -> {args.out}"
    )


if __name__ == "__main__":
    main()
