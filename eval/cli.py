"""`dapo-suite eval`: evaluate a model (DAPO protocol by default), re-score saved generations, compare runs.

    dapo-suite eval aime24 --n 2 --max-tokens 256            # embedded model, HF engine, on CPU
    dapo-suite eval aime24 --model runs/dapo/checkpoint-last  # the paper's avg@32 protocol
    dapo-suite eval score runs/eval/aime24-embedded/generations.jsonl
    dapo-suite eval compare runs/eval/aime24-base runs/eval/aime24-dapo
Heavy imports (torch, transformers, vllm, openai) happen inside the command that needs them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import click
from click.core import ParameterSource

from dapo_suite.core.cli_options import (
    DTYPE_CHOICES,
    config_option,
    defaults_option,
    dtype_option,
    tools_option,
)
from dapo_suite.core.problems import BENCHMARKS
from eval.config import ENGINES, EvalConfig
from eval.prompts import TEMPLATES

_D = EvalConfig()


def _group_help() -> str:
    benchmarks = "\n".join(
        f"  {name:<8} {rows:>5} problems  {what}" for name, (rows, what) in BENCHMARKS.items()
    )
    return f"""Evaluate a model on math benchmarks with the DAPO protocol, re-score, compare.

\b
  dapo-suite eval BENCHMARK [--model PATH_OR_ID | --endpoint URL] [options]
  dapo-suite eval --file FILE.jsonl|.parquet [--problem-key K --answer-key K]
  dapo-suite eval score GENERATIONS_FILE     re-grade saved generations, no model
  dapo-suite eval compare RUN_A RUN_B        per-problem differences, paired bootstrap

\b
Benchmarks (package data):
{benchmarks}

\b
Defaults = the DAPO protocol (paper sec. 4.1): {_D.n} samples per problem, temperature {_D.temperature},
top_p {_D.top_p}, at most {_D.max_tokens} new tokens, the DAPO prompt template inside the model's chat
template.
No --model and no --endpoint: the embedded SmolLM2-135M-Instruct on the HF engine. Runs resume: rerun the
same command after an interruption and only missing samples are generated.
Every option: `dapo-suite eval run --help`.
"""


class EvalGroup(click.Group):
    """A group whose first argument may be a benchmark name (or an option): then it runs `eval run`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


@click.group(
    name="eval", cls=EvalGroup, help=_group_help(), context_settings={"help_option_names": ["-h", "--help"]}
)
def eval_command() -> None:
    pass


# A run option with EvalConfig's default.
_default_option = functools.partial(defaults_option, _D)


@eval_command.command(name="run")
@click.argument("benchmark", required=False)
@click.option(
    "--model", help="HF model directory or hub id (served model name with --endpoint). Default: embedded."
)
@click.option("--endpoint", help="Base URL of an OpenAI-compatible server, e.g. http://127.0.0.1:8000/v1.")
@_default_option(
    "--engine",
    type=click.Choice(ENGINES),
    help="auto = openai with --endpoint, vllm on a GPU with vLLM installed, else hf.",
)
@click.option("--out", help="Run directory. Default: runs/eval/<benchmark>-<model>.")
@click.option("--file", "file", help="A .jsonl/.parquet eval set instead of a shipped benchmark.")
@_default_option("--problem-key", help="Problem column of --file.")
@_default_option("--answer-key", help="Answer column of --file.")
@_default_option("--id-key", help="Id column (row number if absent).")
@_default_option("--n", type=int, help="Samples per problem (DAPO: 32).")
@_default_option("--temperature", type=float)
@_default_option("--top-p", type=float)
@_default_option(
    "--max-tokens",
    type=int,
    help="New tokens per sample (DAPO L_max).",
)
@_default_option(
    "--template",
    help=f"Prompt template: {', '.join(TEMPLATES)}, or a string holding {{problem}}.",
)
@click.option(
    "--chat-template/--no-chat-template",
    default=_D.chat_template,
    show_default=True,
    help="Wrap the prompt in the model's chat template.",
)
@_default_option("--seed", type=int)
@click.option("--limit", type=int, help="Only the first N problems.")
@dtype_option(
    default=_D.dtype,
    choices=(*DTYPE_CHOICES, "float16"),
    help="Weights dtype (hf, vllm): auto = bfloat16 where bf16 matmuls are native (vLLM; AVX-512 "
    "BF16/AMX CPUs), else float32.",
)
@tools_option(
    "Let the model run ```python blocks in the sandbox between its turns: in process (hf engine), or "
    "over --endpoint with each call run here, client-side; each call is recorded in generations.jsonl and "
    "tool statistics are reported beside avg@k.",
)
@_default_option(
    "--batch-size",
    type=int,
    help="hf: sequences generated together.",
)
@_default_option(
    "--concurrency",
    type=int,
    help="openai: requests in flight.",
)
@_default_option(
    "--max-retries",
    type=int,
    help="openai: retries per request (exponential backoff).",
)
@config_option("EvalConfig")
@click.pass_context
def run_command(ctx: click.Context, benchmark: str | None, config_file: str | None, **flags) -> None:
    """Generate, grade and report (resumes a run directory made with the same settings)."""
    from eval.runner import run_eval

    given = {k: v for k, v in flags.items() if ctx.get_parameter_source(k) == ParameterSource.COMMANDLINE}
    if benchmark is not None:
        given["benchmark"] = benchmark
    if given.get("file") and benchmark is None:
        given["benchmark"] = None
    try:
        config = EvalConfig.from_yaml(config_file, **given) if config_file else EvalConfig(**given)
        if config.file is None and config.benchmark not in BENCHMARKS:
            raise ValueError(
                f"Unknown benchmark {config.benchmark!r}: choose one of {', '.join(BENCHMARKS)}, "
                "or pass --file PATH."
            )
        results = run_eval(config)
    except (ValueError, FileNotFoundError, RuntimeError) as error:
        raise click.ClickException(str(error)) from None
    _print_summary(results, config.run_dir)


@eval_command.command(name="score")
@click.argument("generations", type=click.Path(exists=True))
@click.option(
    "--out", type=click.Path(file_okay=False), help="Where to write results (default: next to the file)."
)
def score_command(generations: str, out: str | None) -> None:
    """Re-grade saved generations (a generations.jsonl or its run directory) without a model."""
    from eval.runner import CONFIG_FILE, write_results
    from eval.scoring import generations_file, read_generations, regrade

    file = generations_file(generations)
    run_dir = Path(out) if out else file.parent
    run_dir.mkdir(parents=True, exist_ok=True)
    saved = file.parent / CONFIG_FILE
    config = json.loads(saved.read_text())["config"] if saved.is_file() else {"file": str(file)}
    saved_records = read_generations(file)
    records = regrade(saved_records)
    changed = sum(a.get("acc") != b["acc"] for a, b in zip(saved_records, records, strict=True))
    try:
        results = write_results(run_dir, config, None, config.get("n"), records)
    except ValueError as error:
        raise click.ClickException(f"{file}: {error}") from None
    click.echo(f"re-graded {len(records)} samples ({changed} verdicts changed from the saved ones)")
    _print_summary(results, run_dir)


@eval_command.command(name="compare")
@click.argument("run_a", type=click.Path(exists=True))
@click.argument("run_b", type=click.Path(exists=True))
@click.option("--resamples", type=int, default=10_000, show_default=True, help="Bootstrap resamples.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--all", "show_all", is_flag=True, help="List every shared problem, not only those that differ."
)
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
def compare_command(run_a: str, run_b: str, resamples: int, seed: int, show_all: bool, as_json: bool) -> None:
    """Per-problem accuracy differences of two runs (directories or generations files) and whether the avg@k
    difference is significant (paired bootstrap over problems)."""
    from eval.compare import compare_runs, format_comparison

    try:
        result = compare_runs(run_a, run_b, resamples, seed)
    except ValueError as error:
        raise click.ClickException(str(error)) from None
    click.echo(json.dumps(result, indent=2) if as_json else format_comparison(result, show_all))


@eval_command.command(name="ls")
def list_command() -> None:
    """List the shipped benchmarks, prompt templates and default settings."""
    for name, (rows, what) in BENCHMARKS.items():
        click.echo(f"{name:<8} {rows:>5}  {what}")
    click.echo("\ntemplates: " + ", ".join(TEMPLATES))
    click.echo("defaults: " + ", ".join(f"{f.name}={getattr(_D, f.name)}" for f in dataclasses.fields(_D)))


def _print_summary(results: dict, run_dir: Path) -> None:
    n = results["n"]
    lo, hi = results["avg@k_ci95"]
    ci = "" if lo is None else f" (95 % CI {100 * lo:.1f}-{100 * hi:.1f})"
    click.echo(
        f"avg@{n} = {100 * results['avg@k']:.1f} %{ci}, pass@{n} = {100 * results['pass@k'][str(n)]:.1f} %, "
        f"maj@{n} = {100 * results['maj@k'][str(n)]:.1f} %, no answer "
        f"{100 * results['format_failure_rate']:.1f} %, truncated {100 * results['truncated_fraction']:.1f} "
        f"%, mean length {results['response_len']['mean']:.0f} tokens"
        + (f", {results['tokens_per_s']:.1f} tokens/s" if results.get("tokens_per_s") else "")
    )
    if tools := results.get("tools"):
        failed = tools["failed_call_rate"]
        click.echo(
            f"tools: {tools['calls_per_response']:.2f} calls a response, {100 * tools['call_rate']:.1f} % of "
            f"responses call, {'-' if failed is None else f'{100 * failed:.1f} %'} of calls fail, "
            f"{tools['timeouts']} timed out"
        )
    click.echo(f"report: {run_dir / 'report.md'}, {run_dir / 'report.png'}, {run_dir / 'results.json'}")
