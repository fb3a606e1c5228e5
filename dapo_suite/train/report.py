"""`dapo-suite report RUN_DIR`: one page (report.md and a self-contained report.html) for a run.

It reads what the stages left on disk, so it works on a `dapo-suite demo` directory (data/, train/, eval/,
chain.json) and on a plain training run directory alike:
- training: config.yaml, metrics.jsonl, summary.json (held-out before/after), training_dynamics.png
- evaluations: eval/*/results.json (pairs named NAME-before / NAME-after are put side by side)
- data: data/stats.json, or the stats.json next to the training file
- provenance: chain.json (each stage's command and wall time) and the package versions
- a `train ladder` directory (ladder_plan.json): its table, tests and plot, rebuilt from the runs'
  metrics.jsonl
"""

from __future__ import annotations

import base64
import json
import platform
import re
from importlib import metadata
from pathlib import Path

import yaml

from dapo_suite.core.stats import confidence_interval_95
from dapo_suite.train.ladder_report import report_ladder
from dapo_suite.train.plots import plot_run
from dapo_suite.train.run_folders import PLAN_FILE
from dapo_suite.train.run_log import read_metrics

CHAIN_FILE = "chain.json"
PACKAGES = ("dapo-suite", "torch", "transformers", "verl", "vllm", "math-verify", "datasets", "gradio")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def training_dir(run_dir: Path) -> Path | None:
    for candidate in (run_dir, run_dir / "train"):
        if (candidate / "metrics.jsonl").is_file():
            return candidate
    return None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def _with_interval(mean: float, interval: tuple[float, float]) -> str:
    low, high = interval
    return f"{_pct(mean)} ({_pct(low)}-{_pct(high)})"


def _heldout_cell(result: dict) -> str:
    return _with_interval(result["acc"], confidence_interval_95(result["acc"], result["acc_stderr"]))


def heldout_rows(train_dir: Path) -> list[str]:
    summary_path = train_dir / "summary.json"
    if not summary_path.is_file():
        return []
    summary = json.loads(summary_path.read_text())
    if "before" not in summary:
        return []
    before, after = summary["before"], summary.get("after")
    label = f"held-out split, avg@{int(before['samples_per_problem'])} ({int(before['problems'])} problems)"
    cells = [_heldout_cell(before)]
    if after:
        cells += [_heldout_cell(after), f"{100 * (after['acc'] - before['acc']):+.1f}"]
    else:
        cells += ["(training not finished)", ""]
    return [f"| {label} | " + " | ".join(cells) + " |"]


def eval_rows(run_dir: Path) -> list[str]:
    """One row per benchmark: before/after pairs side by side, single evaluations in the 'after' column."""
    results = {
        path.parent.name: json.loads(path.read_text()) for path in sorted(run_dir.glob("eval/*/results.json"))
    }
    names = sorted({re.sub(r"-(before|after)$", "", name) for name in results})
    rows = []
    for name in names:
        before, after = results.get(f"{name}-before"), results.get(f"{name}-after", results.get(name))
        reference = after or before
        config = reference["config"]
        label = (
            f"{config.get('benchmark') or config.get('file')}, avg@{reference['n']} "
            f"({reference['num_problems']} problems, max {config.get('max_tokens')} tokens)"
        )

        def cell(result):
            return "" if result is None else _with_interval(result["avg@k"], result["avg@k_ci95"])

        delta = f"{100 * (after['avg@k'] - before['avg@k']):+.1f}" if before and after else ""
        rows.append(f"| {label} | {cell(before)} | {cell(after)} | {delta} |")
    return rows


def data_section(run_dir: Path, train_config: dict) -> list[str]:
    stats_path = run_dir / "data" / "stats.json"
    if not stats_path.is_file() and train_config.get("train_file"):
        stats_path = Path(train_config["train_file"]).parent / "stats.json"
    if not stats_path.is_file():
        source = train_config.get("train_file") or f"built-in task `{train_config.get('task', 'arithmetic')}`"
        return [
            "## Data",
            "",
            f"Training problems: {source} (no `dapo-suite data build` statistics found).",
            "",
        ]
    stats = json.loads(stats_path.read_text())
    lines = [
        "## Data",
        "",
        f"Built by `dapo-suite data build` into `{stats_path.parent}`: "
        f"**{stats['exported_rows']} rows** exported ({stats['unverified_rows']} unverified).",
        "",
        "| stage | rows in | rows out | dropped |",
        "|---|---|---|---|",
    ]
    for name, stage in stats["stages"].items():
        dropped = ", ".join(f"{k} {v}" for k, v in (stage["dropped"] or {}).items()) or "-"
        lines.append(f"| {name} | {stage['in']} | {stage['out']} | {dropped} |")
    types = ", ".join(f"{k} {v}" for k, v in stats["answer_types"]["analysed"].items())
    lines += ["", f"Answer types before rewriting: {types}."]
    contamination = stats.get("contamination", {}).get("per_eval_set", {})
    if contamination:
        removed = ", ".join(f"{name} {c['train_rows_removed']}" for name, c in contamination.items())
        lines.append(f"Training rows removed as copies of evaluation problems: {removed}.")
    return lines + [""]


def training_section(train_dir: Path, run_dir: Path) -> list[str]:
    config = yaml.safe_load((train_dir / "config.yaml").read_text())
    # a training step logs its reward (held-out records do not); verl's log has no train-sample accuracy
    steps = [r for r in read_metrics(train_dir) if "reward/mean" in r]
    png = plot_run(train_dir)
    lines = [
        "## Training",
        "",
        f"Presets {', '.join(config.get('presets') or [])}; model `{config['model']}`; {len(steps)} of "
        f"{config['max_steps']} steps; {config['train_batch_size']} prompts x {config['group_size']} "
        f"responses per step; clip ({config['clip_low']}, {config['clip_high']}); loss "
        f"`{config['loss_agg']}`; dynamic sampling {'on' if config['dynamic_sampling'] else 'off'}; overlong "
        f"penalty {'on' if config['overlong_penalty'] else 'off'}, overlong filter "
        f"{'on' if config['overlong_filter'] else 'off'}; lr {config['lr']}.",
        "",
    ]
    if steps:
        first, last = steps[0], steps[-1]
        seconds = sum(r.get("perf/step_seconds", 0.0) for r in steps)
        lines += [
            "| | first step | last step |",
            "|---|---|---|",
            f"| train-sample accuracy (%) | {_pct(first.get('reward/acc'))} | {_pct(last.get('reward/acc'))} "
            "|",
            f"| entropy (nats/token) | {first.get('actor/entropy', float('nan')):.3f} | "
            f"{last.get('actor/entropy', float('nan')):.3f} |",
            f"| mean response length (tokens) | {first['response_len/mean']:.1f} | "
            f"{last['response_len/mean']:.1f} |",
            f"| truncated responses (%) | {_pct(first['response_len/clip_ratio'])} | "
            f"{_pct(last['response_len/clip_ratio'])} |",
            "",
            f"Training time: {seconds / 60:.1f} min of steps.",
            "",
        ]
    lines += [f"![training dynamics]({_relative(png, run_dir)})", ""]
    return lines


def _relative(path: Path, base: Path) -> str:
    try:
        return str(path.relative_to(base))
    except ValueError:
        return str(path)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "(running)"
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def provenance_section(run_dir: Path) -> list[str]:
    lines = ["## How this was produced", ""]
    chain_path = run_dir / CHAIN_FILE
    versions = package_versions()
    if chain_path.is_file():
        chain = json.loads(chain_path.read_text())
        lines += ["| stage | command | wall time |", "|---|---|---|"]
        for stage in chain["stages"]:
            lines.append(f"| {stage['name']} | `{stage['command']}` | {_duration(stage.get('seconds'))} |")
        total = sum(stage.get("seconds") or 0.0 for stage in chain["stages"])
        lines.append(f"| total | | {_duration(total)} |")
        versions = chain.get("versions", versions)
        lines.append("")
    lines += ["Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".", ""]
    return lines


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Write RUN_DIR/report.md and RUN_DIR/report.html (images inlined); return both paths."""
    run_dir = Path(run_dir)
    train_dir = training_dir(run_dir)
    has_evals = any(run_dir.glob("eval/*/results.json"))
    is_ladder = (run_dir / PLAN_FILE).is_file()
    if train_dir is None and not has_evals and not is_ladder:
        raise FileNotFoundError(
            f"{run_dir} holds no training run (metrics.jsonl), no eval/*/results.json and no {PLAN_FILE}: "
            f"pass the directory of `dapo-suite demo`, `train --out` or `train ladder`."
        )
    train_config = yaml.safe_load((train_dir / "config.yaml").read_text()) if train_dir else {}
    lines = [
        f"# dapo-suite report: {run_dir.name}",
        "",
        "Accuracy in % with 95 % intervals (normal approximation over problems); before = the model the run "
        "started from, after = its last checkpoint.",
        "",
        "## Evaluation",
        "",
        "| benchmark | before | after | change (points) |",
        "|---|---|---|---|",
    ]
    lines += (heldout_rows(train_dir) if train_dir else []) + eval_rows(run_dir) + [""]
    if is_ladder:  # rebuilt from the runs' metrics.jsonl, so the report never shows a stale table
        lines += ["## Ablation ladder", "", report_ladder(run_dir).read_text(), ""]
    lines += data_section(run_dir, train_config)
    if train_dir:
        lines += training_section(train_dir, run_dir)
        checkpoint = train_dir / "checkpoint-last"
        if checkpoint.exists():
            lines += [f"Chat with the trained model: `dapo-suite serve --model {checkpoint}`", ""]
    lines += provenance_section(run_dir)
    text = "\n".join(lines)
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    md_path.write_text(text)
    html_path.write_text(_html(text, run_dir))
    return md_path, html_path


def _html(markdown_text: str, base: Path) -> str:
    import markdown

    body = markdown.markdown(markdown_text, extensions=["tables"])

    def inline(match: re.Match) -> str:
        path = base / match.group(1)
        if not path.is_file():
            return match.group(0)
        return f'src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}"'

    body = re.sub(r'src="([^"]+\.png)"', inline, body)
    style = (
        "body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 "
        "1em;line-height:1.45}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:4px "
        "8px}img{max-width:100%}code{background:#f3f3f3;padding:1px 4px}"
    )
    return (
        "<!doctype html><meta charset='utf-8'><title>dapo-suite "
        f"report</title><style>{style}</style>\n{body}\n"
    )
