"""`dapo-suite`: the command line. Each stage lives in its own package and is imported only when its command
runs, so `dapo-suite --help` answers instantly and a stage's heavy dependencies load only for that stage."""

from __future__ import annotations

import errno
import importlib
import os
import re

import click

from dapo_suite import __version__
from dapo_suite.core.cli_options import dtype_option, folder_option, tools_option
from dapo_suite.core.errors import UserError

# name -> (module, attribute, one-line help). A stage whose module is missing says so and exits non-zero.
STAGES = {
    "data": (
        "data_pipeline.cli",
        "data",
        "Build DAPO-Math-17K-style data: dedup, decontaminate, rewrite to integer answers.",
    ),
    "train": (
        "dapo_suite.train.cli",
        "train",
        "Train with DAPO: embedded CPU/GPU trainer, or verl + Ray + vLLM at scale.",
    ),
    "eval": (
        "eval.cli",
        "eval_command",
        "Evaluate: avg@32 on AIME 2024 (the paper's protocol), pass@k, maj@k, more benchmarks.",
    ),
    "serve": (
        "serve.cli",
        "serve",
        "Chat with a trained reasoner in the browser (Gradio) or serve an OpenAI-compatible API.",
    ),
    "sandbox": (
        "serve.sandbox_cli",
        "sandbox",
        "Run model-written Python isolated, once or as a SandboxFusion server.",
    ),
}


# Failures of the machine, not of dapo-suite or the input: errno -> what to do.
ENVIRONMENT_ERRORS = {
    errno.ENOSPC: "The disk is full: free space (old runs, checkpoints) or write elsewhere with --out.",
    errno.EDQUOT: "The disk quota is used up: free space or write elsewhere with --out.",
    errno.EFBIG: "The file system refuses a file this large: write to another file system with --out.",
    errno.EROFS: "The file system is read-only: write elsewhere with --out.",
    errno.EACCES: "Permission denied: write to a folder you own with --out, or fix the folder's permissions.",
    errno.EPERM: "Operation not permitted: write to a folder you own with --out.",
    errno.ENOENT: "A folder on that path does not exist and cannot be made there: check the path.",
    errno.ENOTDIR: "A part of that path is a file, not a folder: check the path.",
}


class StageGroup(click.Group):
    """Lists every stage in `--help`, and loads a stage's command lazily when it is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(STAGES) + sorted(super().list_commands(ctx))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in STAGES:
            return super().get_command(ctx, name)
        module_name, attribute, help_text = STAGES[name]
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except ModuleNotFoundError as error:
            if error.name is None or not module_name.startswith(error.name):
                raise
            return _not_built(name, help_text)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["dapo_suite.argv"] = list(args)  # for messages that name a flag's value
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context):
        """The one place errors become a message: UserError -> its message and exit 1; a failure of the
        machine (disk full, read-only, permissions: ENVIRONMENT_ERRORS) -> the path and what to do; any other
        exception is a bug -> one line saying so, or its traceback under --debug."""
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except UserError as error:
            raise click.ClickException(str(error)) from None
        except Exception as error:
            if ctx.params.get("debug"):
                raise
            if (code := environment_errno(error)) is not None:
                where = getattr(error, "filename", None) or _output_folder(ctx)
                raise click.ClickException(
                    f"{where}: {os.strerror(code)}. {ENVIRONMENT_ERRORS[code]} Files "
                    "already written are kept; rerun the same command to resume."
                ) from None
            raise click.ClickException(
                f"unexpected {type(error).__name__}: {error}\nThis is a bug in dapo-suite, not in your "
                f"input: rerun with `dapo-suite --debug ...` for the traceback and report it."
            ) from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in STAGES.items()]
        rows += [(name, self.commands[name].get_short_help_str(80)) for name in sorted(self.commands)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def environment_errno(error: BaseException) -> int | None:
    """The errno of a failure of the machine (ENVIRONMENT_ERRORS): an OSError's, one's in the exception's
    chain, or the `(os error N)` that Rust-backed libraries (safetensors, tokenizers) put in their own
    exceptions' messages."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in ENVIRONMENT_ERRORS:
            return seen.errno
        found = re.search(r"\(os error (\d+)\)", str(seen))
        if found and int(found[1]) in ENVIRONMENT_ERRORS:
            return int(found[1])
        seen = seen.__cause__ or seen.__context__
    return None


def _output_folder(ctx: click.Context) -> str:
    """Where the failed write went, when the OS error names no file (a write to an open file): the --out
    given."""
    args = ctx.meta.get("dapo_suite.argv", [])
    for flag, value in zip(args, args[1:], strict=False):
        if flag == "--out":
            return f"a file under {value}"
    return next(
        (arg.split("=", 1)[1] for arg in args if arg.startswith("--out=")), "a file the command writes"
    )


def _not_built(name: str, help_text: str) -> click.Command:
    @click.command(
        name=name,
        help=f"{help_text}\n\nNot built yet in this version.",
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def command() -> None:
        raise click.ClickException(f"`dapo-suite {name}` is not built yet in dapo-suite {__version__}.")

    return command


@click.group(cls=StageGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dapo-suite")
@click.option("--debug", is_flag=True, help="Show the full traceback of an unexpected error.")
def main(debug: bool) -> None:
    """dapo-suite: DAPO (arXiv 2503.14476) end to end, on a laptop or on 128 GPUs.

    \b
    A typical session:
      dapo-suite data build --input math_train --rewriter rules --out data/   # integer-answer RL data
      dapo-suite train --preset dapo --out runs/dapo                          # DAPO training
      dapo-suite eval aime24 --model runs/dapo/checkpoint-last                # avg@32 on AIME 2024
      dapo-suite serve --model runs/dapo/checkpoint-last                      # chat in the browser

    Every command explains itself: `dapo-suite COMMAND --help`.
    """


@main.command()
@folder_option("runs/demo", "Run directory (data/, eval/, train/, report.md); a rerun resumes it.")
@click.option("--max-steps", type=int, help="Training steps (default: the tiny-cpu preset's).")
@click.option(
    "--seed",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Seed of the training run (held-out split, prompts, samples); docs/results/demo/ compares seeds.",
)
@click.option("--aime-n", type=int, help="Samples per AIME 2024 problem [2] (the paper: 32).")
@click.option("--aime-max-tokens", type=int, help="Tokens per AIME sample [256] (the paper: 20480).")
@click.option("--aime-limit", type=int, help="Only the first N AIME problems (default: all 30).")
@dtype_option(
    "Precision of every stage: auto = bf16 where the CPU has it natively (AVX-512 BF16, AMX), else "
    "float32; float32 runs as a CPU without native bf16 does.",
)
@tools_option(
    "Let the model run ```python blocks in the sandbox between its turns, in training (the dapo-tool "
    "preset) and in both evaluations (docs/tools.md).",
)
@click.option(
    "--set",
    "assignments",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a training config field, e.g. --set group_size=8 (see `dapo-suite train --help`).",
)
def demo(
    out: str,
    max_steps: int | None,
    seed: int,
    aime_n: int | None,
    aime_max_tokens: int | None,
    aime_limit: int | None,
    dtype: str,
    tools: str | None,
    assignments: tuple[str, ...],
) -> None:
    """The whole chain on the embedded model on a CPU (`make demo`; native bf16 is faster than float32, and
    the measured times are in docs/results/demo/README.md).

    \b
    data build (shipped raw problems) -> AIME 2024 eval -> DAPO training with held-out accuracy before and
    after -> AIME 2024 eval of the checkpoint -> report.md / report.html. Prints how to chat with the result.
    """
    import logging

    from dapo_suite.demo import DemoConfig, run_demo
    from dapo_suite.train.config import parse_override

    try:
        overrides = dict(parse_override(assignment) for assignment in assignments)
    except ValueError as error:
        raise click.UsageError(str(error)) from error
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    given = dict(aime_n=aime_n, aime_max_tokens=aime_max_tokens, aime_limit=aime_limit)
    run_dir = run_demo(
        DemoConfig(
            out=out,
            max_steps=max_steps,
            seed=seed,
            dtype=dtype,
            train_overrides=overrides,
            tools=tools,
            **{key: value for key, value in given.items() if value is not None},
        )
    )
    click.echo(
        f"\nreport: {run_dir / 'report.md'} (and report.html)\n"
        f"chat with the trained model: dapo-suite serve --model {run_dir / 'train' / 'checkpoint-last'}"
        + (f" --tools {tools}" if tools else "")
    )


@main.command()
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
def report(run_dir: str) -> None:
    """Write RUN_DIR/report.md and report.html: evaluation table (before/after, 95 % intervals),
    training-dynamics plots, dataset statistics, and the commands and versions that produced them.

    RUN_DIR is a `dapo-suite demo` directory, a `dapo-suite train --out` directory, or a
    `dapo-suite train ladder --out` directory (its table, seed-paired tests and plots rebuilt from the runs'
    metrics.jsonl)."""
    from dapo_suite.train.report import write_report

    try:
        markdown_path, html_path = write_report(run_dir)
    except FileNotFoundError as error:
        raise click.UsageError(str(error)) from error
    click.echo(f"{markdown_path}\n{html_path}")


if __name__ == "__main__":
    main()
