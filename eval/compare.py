"""Compare two runs on the same problems: per-problem accuracy differences and a paired bootstrap over
problems for the avg@k difference (Efron & Tibshirani 1993; the resampled unit is the problem, as in SE)."""

from __future__ import annotations

from pathlib import Path

from dapo_suite.core import stats
from eval.scoring import GENERATIONS_FILE, generations_file, group_by_problem, read_generations


def paired_bootstrap(acc_a: list[float], acc_b: list[float], resamples: int = 10_000, seed: int = 0) -> dict:
    """Delta = mean_i (b_i - a_i) over the P shared problems. Resample problems with replacement `resamples`
    times; the 95 % interval is the 2.5/97.5 percentiles of the resampled Delta*, and the two-sided p-value is
    min(1, 2 min(P(Delta* <= 0), P(Delta* >= 0))). Significant at 5 % when the interval excludes 0."""
    import numpy as np

    diffs = np.asarray(stats.paired_differences(acc_a, acc_b), dtype=float)
    rng = np.random.default_rng(seed)
    index = rng.integers(0, len(diffs), size=(resamples, len(diffs)))
    boot = diffs[index].mean(axis=1)
    low, high = np.percentile(boot, [2.5, 97.5])
    p_value = min(1.0, 2 * min(float((boot <= 0).mean()), float((boot >= 0).mean())))
    if np.all(diffs == 0):
        p_value = 1.0
    return {
        "delta": float(diffs.mean()),
        "ci95": [float(low), float(high)],
        "p_value": p_value,
        "significant": bool(low > 0 or high < 0),
        "resamples": resamples,
    }


def load_run(path: str | Path) -> dict[str, list[bool]]:
    """Correctness per problem of a run directory or a generations file."""
    path = Path(path)
    records = read_generations(generations_file(path))
    if not records:
        raise ValueError(f"{path}: no generations found (expected a run directory or a {GENERATIONS_FILE}).")
    return {pid: [bool(s["acc"]) for s in g] for pid, g in group_by_problem(records).items()}


def compare_runs(path_a: str | Path, path_b: str | Path, resamples: int = 10_000, seed: int = 0) -> dict:
    """avg@k of both runs on their shared problems, the bootstrap of the difference (B - A), per-problem
    rows."""
    run_a, run_b = load_run(path_a), load_run(path_b)
    shared = [pid for pid in run_a if pid in run_b]
    if not shared:
        raise ValueError(f"{path_a} and {path_b} share no problem id: were they run on the same benchmark?")
    acc_a = [stats.problem_accuracy(run_a[p]) for p in shared]
    acc_b = [stats.problem_accuracy(run_b[p]) for p in shared]
    return {
        "a": str(path_a),
        "b": str(path_b),
        "shared_problems": len(shared),
        "only_a": len(run_a) - len(shared),
        "only_b": len(run_b) - len(shared),
        "avg_a": sum(acc_a) / len(shared),
        "avg_b": sum(acc_b) / len(shared),
        "bootstrap": paired_bootstrap(acc_a, acc_b, resamples, seed),
        "problems": [
            {"id": p, "acc_a": a, "acc_b": b, "n_a": len(run_a[p]), "n_b": len(run_b[p])}
            for p, a, b in zip(shared, acc_a, acc_b, strict=True)
        ],
    }


def format_comparison(result: dict, show_all: bool = False) -> str:
    """A plain-text table: problems whose accuracy differs (all with `show_all`), then the verdict."""
    rows = [p for p in result["problems"] if show_all or p["acc_a"] != p["acc_b"]]
    boot = result["bootstrap"]
    lines = [
        f"A = {result['a']}",
        f"B = {result['b']}",
        f"{result['shared_problems']} shared problems ({result['only_a']} only in A, {result['only_b']} only "
        "in B)",
        "",
        f"{'problem':<28} {'A %':>7} {'B %':>7} {'B-A':>7}",
    ]
    lines += [
        f"{p['id']:<28} {100 * p['acc_a']:7.1f} {100 * p['acc_b']:7.1f} "
        f"{100 * (p['acc_b'] - p['acc_a']):+7.1f}"
        for p in rows
    ]
    if not rows:
        lines.append("(no problem differs)")
    lo, hi = boot["ci95"]
    verdict = "significant" if boot["significant"] else "not significant"
    # no resample crossed zero: the bootstrap can only say p is below its resolution, 2 / resamples
    # (two-sided)
    p_text = f"p < {2 / boot['resamples']:.4f}" if boot["p_value"] == 0 else f"p = {boot['p_value']:.3f}"
    lines += [
        "",
        f"avg: A {100 * result['avg_a']:.1f} %, B {100 * result['avg_b']:.1f} %, "
        f"B - A = {100 * boot['delta']:+.1f} points (95 % CI {100 * lo:+.1f} to {100 * hi:+.1f}, "
        f"{p_text}, paired bootstrap over problems, {boot['resamples']} resamples): {verdict} at 5 %",
    ]
    return "\n".join(lines)
