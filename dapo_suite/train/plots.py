"""The paper's training-dynamics panels (its Figures 2, 3 and 7) drawn from a run's metrics.jsonl."""

from __future__ import annotations

from pathlib import Path

from dapo_suite.train.run_log import read_metrics

PANELS = [
    ("accuracy", [("reward/acc", "train samples"), ("val/acc", "held-out avg@n")]),
    ("entropy of the policy", [("actor/entropy", "mean token entropy")]),
    ("response length (tokens)", [("response_len/mean", "mean"), ("response_len/max", "max")]),
    (
        "clip fractions",
        [
            ("actor/clipfrac_upper", "upper (r > 1+eps_high, A > 0)"),
            ("actor/clipfrac_lower", "lower (r < 1-eps_low, A < 0)"),
        ],
    ),
    (
        "dynamic sampling",
        [("sampling/groups_kept", "groups kept"), ("sampling/gen_batches", "generation batches")],
    ),
    (
        "reward",
        [
            ("reward/mean", "mean reward (incl. overlong penalty)"),
            ("reward/format_rate", "an answer is extracted"),
        ],
    ),
]


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Write `training_dynamics.png` (one panel per quantity) and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(run_dir)
    out = Path(out) if out else Path(run_dir) / "training_dynamics.png"
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    for axis, (title, series) in zip(axes.flat, PANELS, strict=True):
        for key, label in series:
            points = [(r["step"], r[key]) for r in records if key in r]
            if points:
                steps, values = zip(*points, strict=True)
                axis.plot(steps, values, marker="o" if len(points) < 30 else None, markersize=3, label=label)
        axis.set_title(title)
        axis.set_xlabel("step")
        axis.grid(alpha=0.3)
        if axis.lines:
            axis.legend(fontsize=8)
    figure.suptitle(f"DAPO training dynamics: {Path(run_dir).name}")
    figure.tight_layout()
    figure.savefig(out, dpi=110)
    plt.close(figure)
    return out
