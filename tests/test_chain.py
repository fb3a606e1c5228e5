"""The whole chain (`dapo-suite demo`) and the run report, at toy scale with the real embedded model, data
pipeline, trainer and evaluator (the ladder's tests: tests/train/test_ladder.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from toy import TOY_FLAGS, dapo_suite


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    out = tmp_path_factory.mktemp("chain") / "demo"
    result = dapo_suite(
        "demo",
        "--out",
        str(out),
        "--max-steps",
        "1",
        "--aime-limit",
        "2",
        "--aime-n",
        "1",
        "--aime-max-tokens",
        "4",
        "--dtype",
        "float32",
        *TOY_FLAGS,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return out, result


def test_demo_runs_every_stage_and_says_how_to_chat(demo_run):
    out, result = demo_run
    stats = json.loads((out / "data" / "stats.json").read_text())
    assert stats["stages"]["dedup"]["dropped"] and stats["stages"]["decontaminate"]["dropped"]
    assert (out / "data" / "train.parquet").is_file()
    for name in ("aime24-before", "aime24-after"):
        results = json.loads((out / "eval" / name / "results.json").read_text())
        assert results["num_problems"] == 2 and results["complete"]
    assert json.loads((out / "eval" / "aime24-after" / "config.json").read_text())["config"]["model"] == str(
        out / "train" / "checkpoint-last"
    )
    summary = json.loads((out / "train" / "summary.json").read_text())
    assert {"before", "after"} <= set(summary)
    chain = json.loads((out / "chain.json").read_text())
    assert [s["name"] for s in chain["stages"]] == ["data", "eval before", "train", "eval after", "report"]
    assert "--set group_size=2" in chain["stages"][2]["command"]
    assert f"dapo-suite serve --model {out / 'train' / 'checkpoint-last'}" in result.stdout


def test_demo_dtype_sets_the_precision_of_every_stage(demo_run):
    """`--dtype float32` (what a CPU without native bf16 runs) reaches both evaluations and the training
    run."""
    out, _ = demo_run
    for name in ("aime24-before", "aime24-after"):
        assert json.loads((out / "eval" / name / "config.json").read_text())["config"]["dtype"] == "float32"
    train = (out / "train" / "config.yaml").read_text()
    assert "sampling_dtype: null" in train and "autocast_dtype: null" in train
    stages = json.loads((out / "chain.json").read_text())["stages"]
    assert "--dtype float32" in stages[1]["command"] and "--set sampling_dtype=null" in stages[2]["command"]


def test_report_tables_plots_data_and_provenance(demo_run):
    out, _ = demo_run
    text = (out / "report.md").read_text()
    summary = json.loads((out / "train" / "summary.json").read_text())
    before, after = summary["before"], summary["after"]
    heldout = next(line for line in text.splitlines() if line.startswith("| held-out split"))
    assert f"{100 * before['acc']:.1f} (" in heldout and f"{100 * after['acc']:.1f} (" in heldout
    assert f"{100 * (after['acc'] - before['acc']):+.1f}" in heldout
    aime = json.loads((out / "eval" / "aime24-after" / "results.json").read_text())
    aime_row = next(line for line in text.splitlines() if line.startswith("| aime24"))
    assert "avg@1 (2 problems, max 4 tokens)" in aime_row and f"{100 * aime['avg@k']:.1f} (" in aime_row
    assert "| dedup |" in text and "| decontaminate |" in text
    assert "![training dynamics](train/training_dynamics.png)" in text
    assert "dapo-suite data build --input arithmetic" in text and "torch " in text
    html = (out / "report.html").read_text()
    assert "<table>" in html and re.search(r'src="data:image/png;base64,iVBORw0KGgo', html)


def test_a_rerun_of_the_demo_resumes_instead_of_redoing(demo_run):
    out, _ = demo_run
    metrics_before = (out / "train" / "metrics.jsonl").read_text()
    generations = (out / "eval" / "aime24-before" / "generations.jsonl").read_text()
    again = dapo_suite(
        "demo",
        "--out",
        str(out),
        "--max-steps",
        "1",
        "--aime-limit",
        "2",
        "--aime-n",
        "1",
        "--aime-max-tokens",
        "4",
        "--dtype",
        "float32",
        *TOY_FLAGS,
    )
    assert again.returncode == 0, again.stderr[-4000:]
    assert "All 2 samples are on disk" in again.stdout
    assert (out / "train" / "metrics.jsonl").read_text() == metrics_before
    assert (out / "eval" / "aime24-before" / "generations.jsonl").read_text() == generations
    assert len(json.loads((out / "chain.json").read_text())["stages"]) == 5


def test_report_of_a_directory_without_a_run_names_what_it_needs(tmp_path):
    result = dapo_suite("report", str(tmp_path))
    assert result.returncode == 2 and "metrics.jsonl" in result.stderr and "ladder_plan.json" in result.stderr


def test_gsm8k_preset_trains_on_a_decontaminated_build_of_the_train_split(raw_data_dir, tmp_path):
    """The preset's data build (GSM8K 2-step problems + arithmetic), then `train --preset gsm8k-cpu`, one
    toy-sized step: the preset's bf16 sampling runs with rollout correction and logs the sampler-trainer
    log-prob gap."""
    data = tmp_path / "data"
    build = dapo_suite(
        "data",
        "build",
        "--input",
        "gsm8k",
        "--input",
        "arithmetic",
        "--max-solution-steps",
        "2",
        "--limit",
        "40",
        "--out",
        str(data),
        "--data-root",
        str(raw_data_dir),
    )
    assert build.returncode == 0, build.stderr[-4000:]
    stats = json.loads((data / "stats.json").read_text())
    assert "gsm8k" in stats["config"]["decontaminate"] and stats["selection"]["kept_without_steps"] > 0
    assert stats["rejection_reasons"]["above_max_solution_steps"] > 0
    out = tmp_path / "run"
    result = dapo_suite(
        "train",
        "--preset",
        "gsm8k-cpu",
        "--train-file",
        str(data / "train.parquet"),
        "--out",
        str(out),
        "--max-steps",
        "1",
        *TOY_FLAGS,
        "--set",
        "dynamic_sampling=false",
    )  # train on every group,
    assert result.returncode == 0, result.stderr[-4000:]  # mixed or not (toy scale)
    config = (out / "config.yaml").read_text()
    assert "- gsm8k-cpu\n" in config and "sampling_dtype: bfloat16\n" in config and "tiny-cpu" not in config
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step = next(record for record in records if "sampling/groups_kept" in record)
    assert step["step"] == 1 and step["rollout/logprob_diff_max"] > 0
