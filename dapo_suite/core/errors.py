"""The one error type for mistakes a user can fix: a bad flag, file, row, field or endpoint.

Any stage raises `UserError("--flag X: what is wrong; what to do")`; the `dapo-suite` command
(dapo_suite/cli.py) is the one place that turns it into a one-line message and a non-zero exit. Everything
else is a bug and keeps its traceback behind `dapo-suite --debug`. It subclasses ValueError so callers that
validate with `except ValueError` (config loaders, tests) keep working.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the user's input; the message names what to fix and how."""
