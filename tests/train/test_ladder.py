"""`dapo-suite train ladder`: presets over seeds, the table, the seed-paired tests and the plots. The fast
tests rebuild a ladder from metrics.jsonl files written here (the format the trainer logs); the slow one
trains the real embedded model for one step per run."""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

import pytest
from toy import TOY_FLAGS, dapo_suite

from dapo_suite.core.stats import paired_t_test
from dapo_suite.train.ladder_report import comparisons
from dapo_suite.train.run_folders import PLAN_FILE, run_path

# Held-out accuracy after training, per seed 0, 1, 2.
AFTER = {"grpo": [0.1, 0.2, 0.3], "+clip-higher": [0.2, 0.4, 0.6], "dapo": [0.5, 0.5, 0.8]}
BEFORE = [0.05, 0.1, 0.0]


def step_record(step: int, entropy: float, zero: int) -> dict:
    return {
        "step": step,
        "reward/acc": 0.25 * step,
        "actor/entropy": entropy,
        "response_len/mean": 10.0 * step,
        "actor/clipfrac_upper": 0.001 * step,
        "sampling/groups_all_correct": 1,
        "sampling/groups_all_wrong": 2,
        "sampling/groups_mixed": 1,
        "sampling/groups_zero_advantage": zero,
        "perf/step_seconds": 30.0,
    }


def write_ladder(out: Path, finished: bool = True) -> None:
    """A ladder as the command leaves it: the plan, and per run two steps and the held-out evaluations (before
    only in the first rung's runs; the others get it in summary.json, not in metrics)."""
    out.mkdir(parents=True)
    (out / PLAN_FILE).write_text(
        json.dumps({"presets": list(AFTER), "seeds": [0, 1, 2], "overrides": {"max_steps": 2}})
    )
    for rung, afters in AFTER.items():
        for seed, after in enumerate(afters):
            records = [{"step": 0, "val/acc": BEFORE[seed]}] if rung == "grpo" else []
            # entropy of the last steps: 1.0 and 2.0 + seed -> mean 1.5 + seed / 2; zero-advantage 3 then 1 of
            # 4
            records += [step_record(1, 1.0, 3), step_record(2, 2.0 + seed, 1)]
            if finished or (rung, seed) != ("dapo", 2):
                records.append({"step": 2, "val/acc": after})
            run_dir = run_path(out, rung, seed)
            run_dir.mkdir(parents=True)
            (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_comparisons_are_each_rung_against_the_previous_the_first_and_grpo_once():
    assert comparisons(["grpo", "a", "b"]) == [("grpo", "a"), ("a", "b"), ("grpo", "b")]
    assert comparisons(["dapo", "grpo", "gspo"]) == [("dapo", "grpo"), ("grpo", "gspo"), ("dapo", "gspo")]
    assert comparisons(["dapo", "gspo", "cispo"]) == [("dapo", "gspo"), ("gspo", "cispo"), ("dapo", "cispo")]
    assert comparisons(["a", "b", "grpo", "c"]) == [
        ("a", "b"),
        ("b", "grpo"),
        ("grpo", "c"),
        ("a", "grpo"),
        ("a", "c"),
    ]
    assert comparisons(["dapo"]) == []


def test_report_only_rebuilds_table_tests_and_plots_from_the_metrics(tmp_path):
    out = tmp_path / "ladder"
    write_ladder(out)
    result = dapo_suite("train", "ladder", "--out", str(out), "--report-only")
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((out / "ladder.json").read_text())
    rows = {row["rung"]: row for row in results["rows"]}
    clip = rows["+clip-higher"]
    assert clip["seeds"] == [0, 1, 2] and clip["before"] == pytest.approx(0.05)
    assert clip["heldout_acc"]["mean"] == pytest.approx(0.4) and clip["heldout_acc"]["std"] == pytest.approx(
        0.2
    )
    assert clip["entropy"]["per_seed"] == pytest.approx([1.5, 2.0, 2.5])
    assert clip["zero_adv_share"]["mean"] == pytest.approx(0.5)  # (3/4 + 1/4) / 2 in every run
    assert clip["minutes"]["mean"] == pytest.approx(1.0)
    tests = {(t["a"], t["b"]): t["measures"] for t in results["tests"]}
    assert list(tests) == [("grpo", "+clip-higher"), ("+clip-higher", "dapo"), ("grpo", "dapo")]
    # +clip-higher - grpo per seed: 0.1, 0.2, 0.3 -> t = 2 sqrt 3 on 2 df, p = 1 - sqrt(12/14); sign-flip 2/8
    acc = tests["grpo", "+clip-higher"]["heldout_acc"]
    assert acc["t_test"]["t"] == pytest.approx(2 * math.sqrt(3))
    assert acc["t_test"]["p_value"] == pytest.approx(1 - math.sqrt(12 / 14))
    assert acc["sign_flip"]["p_value"] == 0.25
    expected = paired_t_test(AFTER["grpo"], AFTER["dapo"])
    assert tests["grpo", "dapo"]["heldout_acc"]["t_test"]["p_value"] == pytest.approx(expected["p_value"])
    # Equal entropy per seed in both rungs: d = 0 everywhere
    assert tests["grpo", "dapo"]["entropy"]["t_test"]["p_value"] == 1.0
    table = (out / "ladder.md").read_text()
    assert "| +clip-higher | 3 | 5.0 -> **40.0 ± 20.0** | +35.0 | 2.00 ± 0.50 |" in table
    assert "| +clip-higher vs grpo | 3 | +20.0 | -4.8 to +44.8 | 3.46 | 0.074 | 0.250 |" in table
    assert (
        "Paired t-test" in table and "sign-flip permutation test" in table and "cannot go below 0.25" in table
    )
    with (out / "ladder.csv").open() as handle:
        assert [row["rung"] for row in csv.DictReader(handle)] == list(AFTER)
    assert (out / "ladder_dynamics.png").stat().st_size > 10_000
    assert dapo_suite("report", str(out)).returncode == 0
    report = (out / "report.md").read_text()
    assert "## Ablation ladder" in report and "(ladder_dynamics.png)" in report
    assert "data:image/png;base64" in (out / "report.html").read_text()


def test_an_unfinished_run_is_left_out_and_named(tmp_path):
    out = tmp_path / "ladder"
    write_ladder(out, finished=False)
    result = dapo_suite("train", "ladder", "--out", str(out), "--report-only", "--presets", "grpo,dapo")
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((out / "ladder.json").read_text())
    assert [row["rung"] for row in results["rows"]] == ["grpo", "dapo"]
    assert results["rows"][1]["seeds"] == [0, 1] and results["missing"] == ["dapo seed 2"]
    assert results["tests"][0]["seeds"] == [0, 1]  # paired on the seeds both rungs finished
    assert results["in_progress"] == ["dapo seed 2 at step 2"]
    assert (
        "Not finished (left out): dapo seed 2. In progress, dashed in the plot: dapo seed 2 at step 2."
        in (out / "ladder.md").read_text()
    )
    # the unfinished run is drawn: without its metrics the plot is another picture
    plot = (out / "ladder_dynamics.png").read_bytes()
    (run_path(out, "dapo", 2) / "metrics.jsonl").unlink()
    assert (
        dapo_suite("train", "ladder", "--out", str(out), "--report-only", "--presets", "grpo,dapo").returncode
        == 0
    )
    assert json.loads((out / "ladder.json").read_text())["in_progress"] == []
    assert (out / "ladder_dynamics.png").read_bytes() != plot


def test_ladder_refuses_what_it_cannot_compare(tmp_path):
    result = dapo_suite("train", "ladder", "--out", str(tmp_path), "--set", "clip_high=0.3")
    assert result.returncode == 2 and "clip_high is one of the switches the ladder compares" in result.stderr
    result = dapo_suite("train", "ladder", "--out", str(tmp_path), "--set", "seed=4")
    assert result.returncode == 2 and "--seeds" in result.stderr
    result = dapo_suite("train", "ladder", "--out", str(tmp_path), "--presets", "dapo,nope")
    assert result.returncode == 2 and "unknown preset 'nope'" in result.stderr
    result = dapo_suite("train", "ladder", "--out", str(tmp_path / "none"), "--report-only")
    assert result.returncode == 2 and "ladder_plan.json" in result.stderr and "Traceback" not in result.stderr
    out = tmp_path / "ladder"
    write_ladder(out)
    result = dapo_suite("train", "ladder", "--out", str(out), "--max-steps", "3")
    assert result.returncode == 2 and "repeat the same" in result.stderr


def test_a_scale_preset_under_every_rung_for_a_checkpoint_of_the_embedded_model(tmp_path):
    """With --model pointing at a checkpoint, tiny-cpu is not applied by itself (the paper's 32B values are
    the base); --scale tiny-cpu puts it under every rung, and a rerun must repeat it."""
    from dapo_suite.train.config import resolve_config

    checkpoint = {"model": str(tmp_path / "checkpoint-last"), "seed": 0}
    assert resolve_config(["grpo"], checkpoint).lr == 1e-6
    scaled = resolve_config(["tiny-cpu", "grpo"], checkpoint)
    assert (scaled.lr, scaled.group_size, scaled.clip_high, scaled.presets) == (
        3e-5,
        16,
        0.2,
        ["tiny-cpu", "grpo"],
    )
    out = tmp_path / "ladder"
    write_ladder(out)
    result = dapo_suite("train", "ladder", "--out", str(out), "--scale", "tiny-cpu", "--max-steps", "2")
    assert result.returncode == 2 and "repeat the same --scale" in result.stderr


@pytest.mark.slow
def test_ladder_with_seeds_trains_every_run_once_and_resumes(tmp_path):
    out = tmp_path / "ladder"
    args = [
        "train",
        "ladder",
        "--out",
        str(out),
        "--presets",
        "grpo,dapo",
        "--seeds",
        "2",
        "--max-steps",
        "1",
        *TOY_FLAGS,
    ]
    result = dapo_suite(*args, "--keep-checkpoints")
    assert result.returncode == 0, result.stderr[-4000:]
    assert all(
        (run_path(out, rung, seed) / "checkpoint-last").is_dir()
        for rung in ("grpo", "dapo")
        for seed in (0, 1)
    )
    summaries = {
        (rung, seed): json.loads((run_path(out, rung, seed) / "summary.json").read_text())
        for rung in ("grpo", "dapo")
        for seed in (0, 1)
    }
    # "before" measured once per seed and shared; the seeds split and sample differently
    assert all(summaries["grpo", seed]["before"] == summaries["dapo", seed]["before"] for seed in (0, 1))
    assert "seed: 1\n" in (run_path(out, "dapo", 1) / "config.yaml").read_text()
    assert "clip_high: 0.2\n" in (run_path(out, "grpo", 0) / "config.yaml").read_text()
    results = json.loads((out / "ladder.json").read_text())
    assert [(row["rung"], row["seeds"], row["steps"]) for row in results["rows"]] == [
        ("grpo", [0, 1], [1, 1]),
        ("dapo", [0, 1], [1, 1]),
    ]
    assert results["tests"][0]["measures"]["heldout_acc"]["t_test"]["n"] == 2
    assert all(math.isfinite(results["rows"][0][name]["mean"]) for name in ("entropy", "zero_adv_share"))
    assert (out / "ladder_dynamics.png").is_file() and "| dapo vs grpo | 2 |" in result.stdout
    # A rerun skips all four
    again = dapo_suite(*args)
    assert again.returncode == 0 and again.stderr.count("finished earlier, skipped") == 4
    # Killed after its last checkpoint, before the evaluation after training: the trainer resumes it from
    # there
    run_dir = run_path(out, "dapo", 1)
    (run_dir / "summary.json").write_text(json.dumps({"before": summaries["dapo", 1]["before"]}))
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run_dir / "metrics.jsonl").write_text("".join(lines[:-1]))
    third = dapo_suite(*args)
    assert third.returncode == 0, third.stderr[-4000:]
    assert third.stderr.count("finished earlier, skipped") == 3 and "resumed from" in third.stderr
    # without --keep-checkpoints, the run it finished gives its checkpoints up; those finished earlier keep
    # theirs
    assert "[4/4] dapo seed 1: checkpoints deleted (" in third.stderr
    assert not (run_dir / "checkpoints").exists() and not (run_dir / "checkpoint-last").is_symlink()
    assert (run_path(out, "dapo", 0) / "checkpoint-last").is_dir()
    after = json.loads((run_dir / "summary.json").read_text())["after"]
    assert after.pop("seconds") > 0 and after == {
        k: v for k, v in summaries["dapo", 1]["after"].items() if k != "seconds"
    }
    assert json.loads((out / "ladder.json").read_text())["missing"] == []


@pytest.mark.slow
def test_workers_on_one_ladder_split_its_runs(tmp_path):
    """A run another worker holds is left to it, the table lists it as not finished, and the plan keeps every
    worker's rungs: a second command given only the missing rung, with --workers 2, completes the ladder; its
    workers' output is in their logs, the run is trained once, and on two cores with one torch thread."""
    import yaml

    from dapo_suite.core.lock import output_lock

    out = tmp_path / "ladder"
    args = ["train", "ladder", "--out", str(out), "--seeds", "1", "--max-steps", "1", *TOY_FLAGS]
    with output_lock(run_path(out, "grpo", 0)):  # this test process is the worker that trains grpo
        first = dapo_suite(*args, "--presets", "grpo,dapo")
    assert first.returncode == 0, first.stderr[-4000:]
    assert f"[1/2] grpo seed 0: another worker is training it (pid {os.getpid()} on " in first.stderr
    assert not (run_path(out, "grpo", 0) / "metrics.jsonl").exists()
    assert json.loads((out / "ladder.json").read_text())["missing"] == ["grpo seed 0"]
    second = dapo_suite(*args, "--presets", "grpo", "--workers", "2")
    assert second.returncode == 0, second.stderr[-4000:]
    logs = sorted((out / "workers").glob("worker-*.log"))
    assert [log.name for log in logs] == ["worker-0.log", "worker-1.log"]
    assert sum(log.read_text().count("[1/1] grpo seed 0: 1 steps") for log in logs) == 1
    results = json.loads((out / "ladder.json").read_text())
    assert results["missing"] == [] and [row["rung"] for row in results["rows"]] == ["grpo", "dapo"]
    assert json.loads((out / PLAN_FILE).read_text())["presets"] == ["grpo", "dapo"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert yaml.safe_load((run_path(out, "grpo", 0) / "config.yaml").read_text())["torch_threads"] == 1


def test_workers_start_only_once_every_config_resolves(tmp_path):
    """A bad --set stops the command with the field named before any worker starts (no worker logs)."""
    out = tmp_path / "ladder"
    result = dapo_suite(
        "train",
        "ladder",
        "--out",
        str(out),
        "--seeds",
        "1",
        "--presets",
        "dapo",
        "--workers",
        "2",
        "--set",
        "group_size=0",
        timeout=120,
    )
    assert result.returncode != 0 and "group_size" in result.stderr and "Traceback" not in result.stderr
    assert not (out / "workers").exists()


@pytest.mark.parametrize(
    "folder", ["ladder", "successors", "precision", "entropy/pilot-seed-0", "entropy", "token-loss"]
)
def test_the_committed_ladder_tables_rebuild_from_the_committed_metrics(folder: str, tmp_path: Path) -> None:
    """docs/results/<folder>/ladder.md is what `--report-only` makes of the plan and metrics committed beside
    it."""
    import shutil

    committed = Path(__file__).resolve().parents[2] / "docs" / "results" / folder
    copy = tmp_path / folder
    shutil.copytree(
        committed,
        copy,
        ignore=shutil.ignore_patterns("ladder.md", "ladder.json", "ladder.csv", "ladder_dynamics.png"),
    )
    result = dapo_suite("train", "ladder", "--out", str(copy), "--report-only", timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (copy / "ladder.md").read_text() == (committed / "ladder.md").read_text()
    assert (copy / "ladder_dynamics.png").read_bytes()[:4] == b"\x89PNG"
