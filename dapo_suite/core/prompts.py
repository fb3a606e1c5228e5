"""The DAPO prompt: the instruction wrapper DAPO-Math-17K uses, shared by training, evaluation and data
export."""

from __future__ import annotations

DAPO_TEMPLATE = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)


def format_prompt(problem: str, template: str = DAPO_TEMPLATE) -> str:
    """The user message for one problem (`{problem}` in the template is replaced; no other braces are
    read)."""
    return template.replace("{problem}", problem.strip())


# Worked examples shown as earlier chat turns when a run asks for shots (`prompt_shots`), as
# lm-evaluation-harness's few-shot-as-multiturn does. They show the answer line and nothing of arithmetic, so
# they teach a small model the format without solving any training or held-out problem for it (arithmetic
# examples would solve some for it: docs/results/demo/README.md).
FORMAT_EXAMPLES = (
    ("How many days are in a week?", "A week has 7 days.\nAnswer: 7"),
    ("How many sides does a triangle have?", "A triangle has 3 sides.\nAnswer: 3"),
)


# With the Python tool (`tools=True`): one sentence that says how to call it, and worked examples that call it
# on the same kind of everyday question, ending with the same answer line (the tool's output is in the
# example).
TOOL_INSTRUCTIONS = (
    "\n\nYou can run Python: write code in a ```python block and its output will be shown in an "
    "```output block."
)
TOOL_EXAMPLES = (
    (
        "How many hours are in a week?",
        "```python\nprint(24 * 7)\n```\n```output\n168\n```\nA week has 168 hours.\nAnswer: 168",
    ),
    (
        "How many minutes are in a day?",
        "```python\nprint(60 * 24)\n```\n```output\n1440\n```\nA day has 1440 minutes.\nAnswer: 1440",
    ),
)


def chat_messages(
    problem: str, template: str = DAPO_TEMPLATE, shots: int = 0, tools: bool = False
) -> list[dict[str, str]]:
    """The chat a model sees: `shots` worked examples (user and assistant turns, FORMAT_EXAMPLES, or
    TOOL_EXAMPLES with `tools`), then the problem as one user turn, as in the DAPO-Math-17K parquet's `prompt`
    column (shots=0, the paper's setting). `tools` adds TOOL_INSTRUCTIONS to every user turn."""
    examples = TOOL_EXAMPLES if tools else FORMAT_EXAMPLES
    if not 0 <= shots <= len(examples):
        raise ValueError(f"shots must be between 0 and {len(examples)}, got {shots}")
    if tools:
        template += TOOL_INSTRUCTIONS
    turns = []
    for example, response in examples[:shots]:
        turns += [
            {"role": "user", "content": format_prompt(example, template)},
            {"role": "assistant", "content": response},
        ]
    return turns + [{"role": "user", "content": format_prompt(problem, template)}]


def render_chat(tokenizer, chat: str | list[dict[str, str]], continue_final: bool = False) -> str:
    """The text a chat model continues: `chat` (a list of messages, or one user turn as a string) through the
    tokenizer's chat template, ending with the assistant's turn opened, or, with `continue_final`, inside the
    last (assistant) message, left open to be continued (a tool's output was appended to it). The one place a
    template is applied, so training, evaluation and serving feed a model the same text for the same chat."""
    messages = [{"role": "user", "content": chat}] if isinstance(chat, str) else list(chat)
    if continue_final:
        return tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def strip_template(content: str, template: str = DAPO_TEMPLATE) -> str:
    """The bare problem of a prompt built with `template` (content without the wrapper is returned as is)."""
    head, _, tail = template.partition("{problem}")
    if content.startswith(head) and content.endswith(tail):
        return content[len(head) : len(content) - len(tail)].strip()
    return content.strip()
