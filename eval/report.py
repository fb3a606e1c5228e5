"""The human-readable side of a run: `report.md` (metrics, pass@k / maj@k table, per-problem table) and
`report.png` (pass@k and maj@k against k; accuracy of every problem)."""

from __future__ import annotations

from pathlib import Path


def _pct(value) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}"


def markdown(results: dict) -> str:
    """The report as Markdown."""
    c = results["config"]
    n = results["n"]
    lo, hi = results["avg@k_ci95"]
    length = results["response_len"]
    source = c.get("file") or c.get("benchmark")
    model = c.get("model") or ("(served)" if c.get("endpoint") else "embedded SmolLM2-135M-Instruct")
    lines = [
        f"# Evaluation: {source}",
        "",
        f"- model: `{model}`" + (f" at `{c['endpoint']}`" if c.get("endpoint") else ""),
        f"- protocol: {n} samples per problem, T = {c.get('temperature')}, top_p = {c.get('top_p')}, "
        f"max {c.get('max_tokens')} new tokens, template `{c.get('template')}`, "
        f"chat template {'on' if c.get('chat_template', True) else 'off'}, seed {c.get('seed')}",
        f"- {results['num_problems']} problems, {results['num_samples']} samples"
        + ("" if results["complete"] else " (**incomplete**: rerun the same command to finish)"),
        "",
        "| metric | value |",
        "|---|---|",
        f"| avg@{n} (%) | {_pct(results['avg@k'])} +- {_pct(results['avg@k_se'])} (95 % CI "
        f"{_pct(lo)}-{_pct(hi)}) |",
        f"| pass@{n} (%) | {_pct(results['pass@k'][str(n)])} |",
        f"| maj@{n} (%) | {_pct(results['maj@k'][str(n)])} |",
        f"| format failures (%) | {_pct(results['format_failure_rate'])} |",
        f"| grader timeouts (could not check, counted wrong) | {results.get('grader_timeouts', 'n/a')} |",
        "| answers past the grader's work bound (counted wrong) | "
        f"{results.get('grader_too_complex', 'n/a')} |",
        f"| truncated (%) | {_pct(results['truncated_fraction'])} |",
        f"| response tokens mean / median / p90 / max | {length['mean']:.0f} / {length['median']:.0f} / "
        f"{length['p90']} / {length['max']} |",
        f"| wall time (s), tokens/s | {results['wall_s'] and round(results['wall_s'], 1)}, "
        f"{results['tokens_per_s'] and round(results['tokens_per_s'], 1)} |",
        *_tool_rows(results.get("tools")),
        "",
        "| k | pass@k (%) | maj@k (%) |",
        "|---|---|---|",
        *(f"| {k} | {_pct(results['pass@k'][k])} | {_pct(results['maj@k'][k])} |" for k in results["pass@k"]),
        "",
        "## Per problem",
        "",
        "| id | answer | correct / n | accuracy (%) | majority correct | no answer | mean tokens |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {p['id']} | {p['answer']} | {p['correct']} / {p['n']} | {_pct(p['accuracy'])} | "
            f"{'yes' if p['majority_correct'] else 'no'} | {p['format_failures']} | {p['mean_len']:.0f} |"
            for p in results["problems"]
        ),
        "",
        "![pass@k and per-problem accuracy](report.png)",
        "",
    ]
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Left: pass@k and maj@k (%) against k (log2 axis). Right: accuracy of each problem, hardest last."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [int(k) for k in results["pass@k"]]
    problems = sorted(results["problems"], key=lambda p: -p["accuracy"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 2]})
    left.plot(ks, [100 * v for v in results["pass@k"].values()], "o-", label="pass@k")
    left.plot(ks, [100 * v for v in results["maj@k"].values()], "s--", label="maj@k")
    left.axhline(100 * results["avg@k"], color="gray", lw=0.8, ls=":", label=f"avg@{results['n']}")
    left.set_xscale("log", base=2)
    left.set_xticks(ks, [str(k) for k in ks])
    left.set(xlabel="k (samples)", ylabel="%", ylim=(-2, 102), title="pass@k and maj@k")
    left.legend(loc="upper left")
    left.grid(alpha=0.3)
    positions = range(len(problems))
    right.bar(positions, [100 * p["accuracy"] for p in problems], color="tab:blue")
    right.set(
        ylabel="accuracy (%)",
        ylim=(0, 102),
        xlim=(-0.6, len(problems) - 0.4),
        title=f"per-problem accuracy ({results['num_problems']} problems, {results['n']}+ samples each)",
    )
    if len(problems) <= 60:
        right.set_xticks(list(positions), [p["id"] for p in problems], rotation=90, fontsize=7)
    else:
        right.set_xlabel("problems, sorted by accuracy")
    source = results["config"].get("file") or results["config"].get("benchmark")
    fig.suptitle(f"{source}: avg@{results['n']} = {_pct(results['avg@k'])} %")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(run_dir: Path, results: dict) -> None:
    (run_dir / "report.md").write_text(markdown(results))
    plot(results, run_dir / "report.png")


def _tool_rows(tools: dict | None) -> list[str]:
    """The tool's rows of the metric table (a run with --tools python)."""
    if not tools:
        return []
    return [
        f"| tool: calls a response, responses that call (%) | {tools['calls_per_response']:.2f}, "
        f"{_pct(tools['call_rate'])} |",
        f"| tool: calls that fail (%), timed out | {_pct(tools['failed_call_rate'])}, {tools['timeouts']} |",
        f"| accuracy with a call / without (%) | {_pct(tools['accuracy_with_calls'])} / "
        f"{_pct(tools['accuracy_without_calls'])} |",
    ]
