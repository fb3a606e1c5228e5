"""benchmarks/time_to_accuracy.py's summary: time to the target, the ratio (or its lower bound when TRL never
gets there), and the rebuild of the committed figures from the committed curves."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = "benchmarks.time_to_accuracy"
COMMITTED = ROOT / "docs" / "results" / "time-to-accuracy"


def summarize(results: Path, *flags: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", SCRIPT, "--summary-only", "--results", str(results), *flags],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (results / "time_to_accuracy.png").stat().st_size > 0
    return json.loads((results / "summary.json").read_text())


def write_curves(results: Path, curves: dict[tuple[str, int], list[tuple[float, float]]]) -> None:
    results.mkdir()
    lines = [
        json.dumps(
            {
                "side": side,
                "seed": seed,
                "batches": 2 * index,
                "seconds": seconds,
                "acc": acc,
                "acc_stderr": 0.05,
            }
        )
        for (side, seed), points in curves.items()
        for index, (seconds, acc) in enumerate(points)
    ]
    (results / "curves.jsonl").write_text("\n".join(lines) + "\n")


def test_ratio_of_mean_times_to_the_first_evaluation_at_the_target(tmp_path):
    write_curves(
        tmp_path / "r",
        {
            ("ours", 0): [
                (0, 0.0),
                (60, 0.3),
                (120, 0.6),
                (180, 0.4),
            ],  # first at 50 %: 120 s (not the later dip)
            ("trl", 0): [(0, 0.0), (300, 0.2), (600, 0.5)],
            ("ours", 1): [(0, 0.0), (240, 0.7)],
            ("trl", 1): [(0, 0.0), (900, 0.8)],
        },
    )
    summary = summarize(tmp_path / "r")
    assert [row["time_to_target"] for row in summary["seeds"]] == [
        {"ours": 120, "trl": 600},
        {"ours": 240, "trl": 900},
    ]
    versus = summary["vs_trl"]["ours"]
    assert versus["ratio"] == pytest.approx((600 + 900) / 2 / ((120 + 240) / 2))
    assert versus["per_seed"] == pytest.approx([5.0, 3.75]) and versus["median"] == pytest.approx(4.375)
    assert not versus["lower_bound"] and list(summary["vs_trl"]) == ["ours"]  # no third arm in these curves
    # accuracy at the end of the shorter run: ours at 180 s (0.4) against TRL's last point at or before it
    # (0.0)
    assert summary["seeds"][0]["acc_at_common"] == {"ours": 0.4, "trl": 0.0}
    assert "PASS" in (tmp_path / "r" / "summary.txt").read_text()


def test_the_arm_with_trls_settings_is_compared_with_trl_seed_by_seed(tmp_path):
    """The third arm (dapo-suite with TRL's sampling and reward) gets its own ratios; one that misses the
    target in a seed gets none, said in the text."""
    write_curves(
        tmp_path / "r",
        {
            ("ours", 0): [(0, 0.0), (100, 0.6)],
            ("ours-trl-settings", 0): [(0, 0.0), (200, 0.5)],
            ("trl", 0): [(0, 0.0), (800, 0.5)],
            ("ours", 1): [(0, 0.0), (100, 0.6)],
            ("ours-trl-settings", 1): [(0, 0.0), (500, 0.5)],
            ("trl", 1): [(0, 0.0), (1000, 0.5)],
            ("ours", 2): [(0, 0.0), (100, 0.6)],
            ("ours-trl-settings", 2): [(0, 0.0), (400, 0.3)],
            ("trl", 2): [(0, 0.0), (600, 0.5)],
        },
    )
    summary = summarize(tmp_path / "r")
    assert summary["vs_trl"]["ours"]["per_seed"] == pytest.approx([8.0, 10.0, 6.0])
    assert summary["vs_trl"]["ours-trl-settings"] == {"reached": 2, "seeds": 3}
    assert (
        summary["seeds"][2]["common_seconds"] == 100 and summary["seeds"][2]["acc_at_common"]["ours"] == 0.6
    )
    text = (tmp_path / "r" / "summary.txt").read_text()
    assert "ours as TRL: reached 50% in 2 of 3 seeds" in text and "median 8.00x" in text


def test_trl_that_never_reaches_the_target_gives_a_lower_bound(tmp_path):
    write_curves(
        tmp_path / "r",
        {("ours", 0): [(0, 0.0), (100, 0.5)], ("trl", 0): [(0, 0.0), (1000, 0.2), (2000, 0.3)]},
    )
    summary = summarize(tmp_path / "r", "--target", "0.5")
    assert summary["seeds"][0]["time_to_target"] == {"ours": 100, "trl": None}
    versus = summary["vs_trl"]["ours"]
    assert versus["lower_bound"] and versus["ratio"] == pytest.approx(20.0)
    assert "lower bound" in (tmp_path / "r" / "summary.txt").read_text()


def test_committed_summary_is_what_the_committed_curves_give(tmp_path):
    if not (COMMITTED / "curves.jsonl").is_file():
        pytest.skip("no committed time-to-accuracy curves")
    results = tmp_path / "r"
    results.mkdir()
    shutil.copy(COMMITTED / "curves.jsonl", results)
    committed = json.loads((COMMITTED / "summary.json").read_text())
    assert summarize(results, "--target", str(committed["target"])) == committed
    assert (results / "summary.txt").read_text() == (COMMITTED / "summary.txt").read_text()


@pytest.mark.slow
def test_our_run_stops_at_its_first_evaluation_at_the_target(tmp_path):
    """The dapo-suite side stops where TRL's does, at its first held-out evaluation at or above the target (0
    % here: the first one after training starts), marked as reached, and a rerun does not train it again."""
    flags = [
        "--sides",
        "ours",
        "--seeds",
        "1",
        "--steps",
        "3",
        "--eval-every",
        "1",
        "--target",
        "0",
        "--heldout-size",
        "16",
        "--out",
        str(tmp_path / "runs"),
        "--results",
        str(tmp_path / "r"),
    ]
    run = subprocess.run(
        [sys.executable, "-m", SCRIPT, *flags], cwd=ROOT, capture_output=True, text=True, timeout=1800
    )
    assert run.returncode == 0, run.stderr[-3000:]
    run_dir = tmp_path / "runs" / "ours" / "seed-0"
    assert (run_dir / "reached").is_file() and not any(run_dir.glob("checkpoint*"))
    curve = [json.loads(line) for line in (tmp_path / "r" / "curves.jsonl").read_text().splitlines()]
    assert [point["batches"] for point in curve] == [0, 1] and curve[1]["seconds"] > 0
    assert (
        yaml.safe_load((run_dir / "config.yaml").read_text())["heldout_size"] == 16
    )  # --heldout-size reached it
    again = subprocess.run(
        [sys.executable, "-m", SCRIPT, *flags], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert again.returncode == 0 and "ours seed 0:" not in again.stdout


def test_trls_evaluation_measures_the_weights_as_they_are_now(embedded_model_dir):
    """TRL's arm evaluates with the project's engine while TRL's optimiser changes the weights in place: each
    measurement must see them as they are then. Here the weights are zeroed in place after a first measurement
    (every token equally likely: no response ends before the length limit); measured from the engine's earlier
    snapshot, the second measurement would repeat the first (it did, in a published run: 23.5 % at every
    evaluation)."""
    from dataclasses import replace

    import torch

    from benchmarks.time_to_accuracy import heldout_now, shared_config
    from dapo_suite.core.prompts import chat_messages, render_chat
    from dapo_suite.inference.models import load_model_and_tokenizer, resolve_precision
    from dapo_suite.train.rollout import hf_engine
    from dapo_suite.train.tasks import train_and_heldout

    config = shared_config(0, "unused", 2)
    heldout = train_and_heldout(config)[1][:4]
    model, tokenizer = load_model_and_tokenizer(str(embedded_model_dir))
    prompts = [render_chat(tokenizer, chat_messages(p.problem, shots=config.prompt_shots)) for p in heldout]
    engine = hf_engine(
        replace(config, sampling_dtype=resolve_precision(config.sampling_dtype)), model, tokenizer
    )
    before = heldout_now(engine, prompts, [p.answer for p in heldout], config)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()
    after = heldout_now(engine, prompts, [p.answer for p in heldout], config)
    assert before["truncated"] < 1.0 and after["truncated"] == 1.0 and after["acc"] == 0.0
