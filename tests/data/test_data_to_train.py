"""What `dapo-suite data build` writes is what both training backends read."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

from dapo_suite.core.prompts import chat_messages
from dapo_suite.train import verl as verl_backend
from dapo_suite.train.config import resolve_config
from dapo_suite.train.tasks import load_problems

RAW = [
    {
        "problem": "Compute $\\frac{1}{2} + \\frac{1}{3}$. Express your answer as a common fraction.",
        "answer": "\\frac{5}{6}",
    },
    {"problem": "What is $3 \\cdot 4$?", "answer": "12"},
    {"problem": "Simplify $\\sqrt{8} + 1$.", "answer": "1 + 2\\sqrt{2}"},
]


def test_built_parquet_trains_on_the_embedded_backend_and_validates_for_verl(tmp_path):
    raw = tmp_path / "raw.jsonl"
    raw.write_text("".join(json.dumps(row) + "\n" for row in RAW))
    out = tmp_path / "built"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "dapo_suite.cli",
            "data",
            "build",
            "--input",
            str(raw),
            "--rewriter",
            "rules",
            "--out",
            str(out),
            "--decontaminate",
            "",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    parquet = out / "train.parquet"

    problems = load_problems(parquet)  # the embedded trainer's reader
    assert {p.answer for p in problems} == {"11", "12", "5"}  # 5/6 -> 5+6; 1+2*sqrt(2) -> 1+2+2; 12 stays
    assert all(p.problem and "Answer:" not in p.problem for p in problems)  # the DAPO wrapper is stripped
    assert chat_messages(problems[0].problem)[0]["content"].startswith("Solve the following math problem")

    config = dataclasses.replace(
        resolve_config(["dapo"], {"model": "Qwen/Qwen2.5-7B", "out": str(tmp_path / "run")}),
        backend="verl",
        train_file=str(parquet),
        val_file=str(parquet),
    )
    hardware = verl_backend.Hardware(nnodes=1, gpus_per_node=8)
    verl_backend.validate(config, hardware, verl_backend.build_overrides(config, hardware))
