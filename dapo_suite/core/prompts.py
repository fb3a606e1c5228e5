"""The DAPO prompt: the instruction wrapper DAPO-Math-17K uses, shared by training, evaluation and data export."""

from __future__ import annotations

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def format_prompt(problem: str, template: str = DAPO_TEMPLATE) -> str:
    """The user message for one problem (`{problem}` in the template is replaced; no other braces are read)."""
    return template.replace("{problem}", problem.strip())


def chat_messages(problem: str, template: str = DAPO_TEMPLATE) -> list[dict[str, str]]:
    """The chat a model sees: one user turn, as in the DAPO-Math-17K parquet's `prompt` column."""
    return [{"role": "user", "content": format_prompt(problem, template)}]


def render_chat(tokenizer, chat: str | list[dict[str, str]]) -> str:
    """The text a chat model continues: `chat` (a list of messages, or one user turn as a string) through the
    tokenizer's chat template, ending with the assistant's turn opened. The one place a template is applied, so
    training, evaluation and serving feed a model the same text for the same chat."""
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else list(chat)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def strip_template(content: str, template: str = DAPO_TEMPLATE) -> str:
    """The bare problem of a prompt built with `template` (content without the wrapper is returned as is)."""
    head, _, tail = template.partition("{problem}")
    if content.startswith(head) and content.endswith(tail):
        return content[len(head) : len(content) - len(tail)].strip()
    return content.strip()
