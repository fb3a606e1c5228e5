"""Options that several commands share, declared once (click)."""

from __future__ import annotations

import click

# The tool the model may call, by the name `--tools` takes (docs/tools.md).
TOOL_CHOICES = ("python",)
DTYPE_CHOICES = ("auto", "float32", "bfloat16")


def defaults_option(defaults: object, flag: str, dest: str | None = None, **kwargs):
    """An option whose default is the field of `defaults` (a stage's config dataclass) it sets, shown in
    --help: the field is `dest`, else the flag's name (`--top-p` -> top_p)."""
    field = dest or flag.removeprefix("--").replace("-", "_")
    names = (flag, dest) if dest else (flag,)
    return click.option(*names, default=getattr(defaults, field), show_default=True, **kwargs)


def folder_option(default: str, help: str):
    """`--out`: the folder a command writes and a rerun resumes, its default shown in --help."""
    return click.option(
        "--out", default=default, show_default=True, type=click.Path(file_okay=False), help=help
    )


def config_option(fields: str, dest: str = "config_file"):
    """`--config FILE`: a YAML of the stage's config dataclass (`fields`, its name); flags override it."""
    return click.option(
        "--config",
        dest,
        type=click.Path(exists=True, dir_okay=False),
        help=f"YAML of {fields} fields; flags given on the command line override it.",
    )


def tools_option(help: str):
    """`--tools python`: let the model run ```python blocks in the sandbox; `help` says where."""
    return click.option("--tools", type=click.Choice(TOOL_CHOICES), default=None, help=help)


def dtype_option(help: str, default: str = "auto", choices: tuple[str, ...] = DTYPE_CHOICES):
    """`--dtype`: the precision a command runs its model in (auto: the CPU's or GPU's native one)."""
    return click.option("--dtype", type=click.Choice(choices), default=default, show_default=True, help=help)
