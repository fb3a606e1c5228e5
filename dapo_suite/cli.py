"""`dapo-suite`: the command line. Each stage lives in its own package and is imported only when its command
runs, so `dapo-suite --help` answers instantly and a stage's heavy dependencies load only for that stage."""

from __future__ import annotations

import importlib

import click

from dapo_suite import __version__

# name -> (module, attribute, one-line help). A stage whose module is missing says so and exits non-zero.
STAGES = {
    "data": ("data_pipeline.cli", "data", "Build DAPO-Math-17K-style data: dedup, decontaminate, rewrite to integer answers."),
    "train": ("dapo_suite.train_cli", "train", "Train with DAPO: embedded CPU/GPU trainer, or verl + Ray + vLLM at scale."),
    "eval": ("eval.cli", "eval_command", "Evaluate: avg@32 on AIME 2024 (the paper's protocol), pass@k, maj@k, more benchmarks."),
    "serve": ("serve.cli", "serve", "Chat with a trained reasoner in the browser (Gradio) or serve an OpenAI-compatible API."),
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

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, help_text) for name, (_, _, help_text) in STAGES.items()]
        rows += [(name, self.commands[name].get_short_help_str(80)) for name in sorted(self.commands)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


def _not_built(name: str, help_text: str) -> click.Command:
    @click.command(name=name, help=f"{help_text}\n\nNot built yet in this version.",
                   context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
    def command() -> None:
        raise click.ClickException(f"`dapo-suite {name}` is not built yet in dapo-suite {__version__}.")

    return command


@click.group(cls=StageGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="dapo-suite")
def main() -> None:
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
@click.option("--out", default="runs/demo", show_default=True, type=click.Path(file_okay=False),
              help="Run directory; a rerun resumes it.")
@click.option("--max-steps", type=int, help="Training steps (default: the tiny-cpu preset's).")
def demo(out: str, max_steps: int | None) -> None:
    """Train the embedded model with DAPO on a CPU and report held-out accuracy before and after (`make demo`)."""
    import logging

    from dapo_suite.demo import run_demo

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    run_demo(out=out, max_steps=max_steps)

if __name__ == "__main__":
    main()
