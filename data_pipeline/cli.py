"""`dapo-suite data`: build DAPO-Math-17K-style training data (integer answers, every rewrite verified)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from dapo_suite.core.cli_options import config_option


@click.group(name="data")
def data() -> None:
    """Build DAPO-Math-17K-style RL data: every answer an integer, every rewrite proven.

    \b
    Why: rule-based rewards are noisy on free-form answers (is 1/2 equal to 0.5? to \\frac12?). DAPO rewrote
    each problem so its answer is an integer: 11-2*sqrt(6) "in the form k-m*sqrt(n)" becomes "find k+m+n" =
    19. Here no rewrite is kept unless sympy proves its integer follows from the original answer.

    \b
    Stages (each resumable; a rerun skips what did not change):
      load -> normalise -> dedup (exact + MinHash near) -> decontaminate (30-gram overlap with eval sets)
      -> analyse (answer type) -> rewrite (rules / LLM) -> verify (sympy) -> export (verl parquet)

    \b
    Examples:
      dapo-suite data build --input math_train --rewriter rules --out data/math
      dapo-suite data build --input gsm8k --input my.jsonl --problem-field question --out data/mix
      dapo-suite data build --input math_train --rewriter rules+llm \\
          --base-url http://127.0.0.1:8000/v1 --model Qwen/Qwen2.5-7B-Instruct --concurrency 16 --out data/llm
      dapo-suite data stats data/math
    """


@data.command()
@click.option(
    "--input",
    "inputs",
    multiple=True,
    metavar="SRC",
    help="Repeatable. A named raw set (math_train, gsm8k, dapo_math_17k), a .jsonl/.json/.parquet/.csv "
    "file, or hf:OWNER/NAME[:SPLIT] (needs the hub or its cache).",
)
@click.option("--out", type=click.Path(file_okay=False), help="Build directory; rerunning into it resumes.")
@config_option("BuildConfig", dest="config_path")
@click.option(
    "--rewriter",
    type=click.Choice(["rules", "llm", "rules+llm"]),
    help="rules: deterministic rewrites (fractions, radicals, pi, decimals). llm: an OpenAI-compatible "
    "model rewrites every non-integer answer. rules+llm: rules first, the LLM for the rest. [rules]",
)
@click.option(
    "--base-url", help="OpenAI-compatible endpoint for the LLM rewriter, e.g. http://127.0.0.1:8000/v1."
)
@click.option("--model", help="Model name sent to --base-url.")
@click.option("--api-key", help="API key for --base-url (default: EMPTY, enough for local servers).")
@click.option("--concurrency", type=int, help="LLM requests in flight at once. [8]")
@click.option("--max-tokens", type=int, help="LLM completion budget per problem (>= 1). [1024]")
@click.option(
    "--request-timeout",
    "request_timeout_s",
    type=float,
    metavar="SECONDS",
    help="Seconds one LLM request may take, waiting in the server's queue included, before it is retried. "
    "[600: enough for --concurrency 8 x 1024 tokens on a CPU server that answers one at a time]",
)
@click.option(
    "--max-failed-fraction",
    type=float,
    help="Share of LLM requests that may fail for good (connection refused, 5xx after every retry) with "
    "their rows rejected; beyond it the build stops. [0: any failure stops it]",
)
@click.option(
    "--decontaminate",
    help="Comma-separated evaluation sets to remove from training: aime24,amc23,math500,"
    "gsm8k [all four]; '' for none.",
)
@click.option(
    "--contamination-threshold",
    type=float,
    help="Fraction of an eval problem's 30-grams that marks a training row as contaminated. [0.6]",
)
@click.option(
    "--near-dup-threshold", type=float, help="Jaccard similarity (word 5-shingles) for near duplicates. [0.8]"
)
@click.option(
    "--eval-dir",
    type=click.Path(file_okay=False),
    help="Folder with {name}.jsonl evaluation sets, when the eval package does not ship them.",
)
@click.option(
    "--data-root",
    type=click.Path(file_okay=False),
    help="Folder of the raw sets behind named sources (default: $DAPO_SUITE_DATA, else "
    "~/.cache/dapo-suite/data; docs/data.md lists the files).",
)
@click.option(
    "--problem-field", help="Dotted path of the problem in each record (e.g. question, prompt.0.content)."
)
@click.option("--answer-field", help="Dotted path of the answer (e.g. answer, reward_model.ground_truth).")
@click.option("--limit", type=int, help="Read only the first N rows of each source (quick trials).")
@click.option(
    "--max-solution-steps",
    type=int,
    help="Drop problems whose reference solution takes more than N steps (GSM8K: 2-8; a free difficulty "
    "estimate). Rows of sources without a worked solution (MATH, arithmetic) are kept.",
)
@click.option(
    "--allow-unverified",
    is_flag=True,
    default=None,
    help="Keep rewrites the verifier cannot prove, flagged extra_info.verified=false.",
)
def build(config_path: str | None, **flags) -> None:
    """Build integer-answer RL data from one or more sources into --out.

    \b
    Writes into --out:
      train.parquet   verl, DAPO-Math-17K schema; each problem as the source gives it, except the repairs of
                      docs/data.md (a "\\frac" read as form feed + "rac", stray control characters, outer
                      blanks)
      rejected.jsonl  every input row not exported, with its stage (load, repair, dedup, decontaminate,
      select,
                      verify) and reason ("missing_answer: ...", "exact_duplicate", "contaminated_near", ...)
      stats.json      counts per stage, and the ledger: input rows = exported + rejected, per reason
      README.md       dataset card; reports/: duplicate clusters, contamination matches, dropped rows per
      stage
    The ledger is printed at the end. A build in which every row is rejected for the same reason stops with
    it.
    """
    from dapo_suite.core.errors import UserError
    from data_pipeline.build import run_build
    from data_pipeline.config import BuildConfig

    flags["inputs"] = list(flags["inputs"]) or None
    if flags.get("decontaminate") is not None:
        flags["decontaminate"] = [s.strip() for s in flags["decontaminate"].split(",") if s.strip()]
    try:
        config = BuildConfig.from_sources(config_path, **flags)
        if not config.out:
            raise ValueError("--out DIR is required.")
        stats = run_build(config, log=click.echo)
    except (ValueError, UserError) as error:  # SourceError and unreadable files alike
        raise click.ClickException(str(error)) from None
    click.echo(
        f"exported {stats['exported_rows']} rows to {Path(config.out) / 'train.parquet'}; rejected "
        f"{stats['ledger']['dropped_rows']} (each with its reason in {Path(config.out) / 'rejected.jsonl'})"
    )


@data.command()
@click.argument("build_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print stats.json as it is.")
def stats(build_dir: str, as_json: bool) -> None:
    """Summarise a finished build: rows per stage, answer types, rejection reasons, contamination."""
    path = Path(build_dir) / "stats.json"
    if not path.is_file():
        raise click.ClickException(f"{path} not found: run `dapo-suite data build --out {build_dir}` first.")
    stats = json.loads(path.read_text())
    if as_json:
        click.echo(json.dumps(stats, indent=1))
        return
    click.echo(f"exported rows: {stats['exported_rows']} (unverified: {stats['unverified_rows']})")
    for name, stage in stats["stages"].items():
        click.echo(f"  {name:14s} {stage['in']:>7} -> {stage['out']:<7} {stage['dropped'] or ''}")
    click.echo(f"answer types: {stats['answer_types']['analysed']}")
    click.echo(f"rejection reasons: {stats['rejection_reasons']}")
    for name, c in stats.get("contamination", {}).get("per_eval_set", {}).items():
        click.echo(
            f"  {name}: {c['eval_problems_exact']} exact, {c['eval_problems_near']} near; "
            f"{c['train_rows_removed']} training rows removed"
        )
