"""The prompt templates of evaluation. DAPO's instruction (reference doc sec. 4) is defined once, in
`dapo_suite.core.prompts` (training and data export use it too); this module re-exports it and adds the other
templates `--template` can name. A template is a string with one `{problem}` field; nothing else in it is
interpreted, so LaTeX braces are safe.
"""

from __future__ import annotations

from dapo_suite.core import prompts as _shared
from dapo_suite.core.prompts import DAPO_TEMPLATE

__all__ = ["DAPO_TEMPLATE", "TEMPLATES", "format_prompt", "resolve_template"]

TEMPLATES = {
    "dapo": DAPO_TEMPLATE,  # the paper's training and evaluation prompt (the default)
    "boxed": "{problem}\n\nPlease reason step by step, and put your final answer within \\boxed{}.",
    "raw": "{problem}",
}


def resolve_template(name_or_text: str) -> str:
    """A template name from TEMPLATES, or a literal template holding `{problem}`."""
    if name_or_text in TEMPLATES:
        return TEMPLATES[name_or_text]
    if "{problem}" not in name_or_text:
        raise ValueError(
            f"--template {name_or_text!r} is neither a known template ({', '.join(TEMPLATES)}) nor a string "
            "holding the field {problem}."
        )
    return name_or_text


def format_prompt(problem: str, template: str = DAPO_TEMPLATE) -> str:
    """The user message for one problem; `template` is a name from TEMPLATES or a literal template."""
    return _shared.format_prompt(problem, resolve_template(template))
