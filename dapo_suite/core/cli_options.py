"""Options that several commands share, declared once (click)."""

from __future__ import annotations

import click


def folder_option(default: str, help: str):
    """`--out`: the folder a command writes and a rerun resumes, its default shown in --help."""
    return click.option(
        "--out", default=default, show_default=True, type=click.Path(file_okay=False), help=help
    )
