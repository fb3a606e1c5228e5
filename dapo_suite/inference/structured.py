"""Structured outputs by constrained decoding (OpenAI's `response_format`): before each token is sampled, the
tokens that cannot continue a JSON object (`json_object`) or a JSON text of the request's schema
(`json_schema`) get probability zero, through llguidance's grammar matcher (the constrained decoder of
Guidance, also in vLLM and llama.cpp) on the CPU.

    grammars = Grammars(tokenizer, vocab_size)  # one per server: the tokenizer read once
    constraint = grammars.constraint(("json_schema", schema))  # one per choice: its own matcher
    constraint.mask(logits_row); ...; constraint.accept(token)

Once the JSON text is complete, only the end-of-sequence tokens are left, so the reply ends there.
"""

from __future__ import annotations

import json
from typing import Any

import torch

# (kind, schema): ("json_object", None) or ("json_schema", the JSON Schema as a dict)
ResponseFormat = tuple[str, dict | None]
ANY_OBJECT = {"type": "object"}  # json_object: OpenAI's JSON mode, any object


class Constraint:
    """One choice's grammar state: `mask` zeroes the probability of every token the grammar refuses next,
    `accept` moves the state past the sampled token."""

    def __init__(self, matcher, bitmask: torch.Tensor) -> None:
        self.matcher, self.bitmask = matcher, bitmask

    def mask(self, logits: torch.Tensor) -> None:
        """`logits` (the vocabulary's, one row) with the refused tokens at -inf, in place."""
        import llguidance.torch

        llguidance.torch.fill_next_token_bitmask(self.matcher, self.bitmask, 0)
        llguidance.torch.apply_token_bitmask_inplace(logits.unsqueeze(0), self.bitmask)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)


class Grammars:
    """The grammars of one tokenizer: llguidance's view of the vocabulary, read once, and a matcher per
    choice."""

    def __init__(self, tokenizer, vocab_size: int) -> None:
        import llguidance
        import llguidance.hf
        import llguidance.torch

        self.llguidance = llguidance
        self.tokenizer = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        self.allocate = llguidance.torch.allocate_token_bitmask

    def constraint(self, response_format: ResponseFormat) -> Constraint:
        kind, schema = response_format
        grammar = self.llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(ANY_OBJECT if schema is None else schema)
        )
        matcher = self.llguidance.LLMatcher(self.tokenizer, grammar)
        if matcher.is_error():
            raise ValueError(f"response_format: the schema cannot be decoded under: {matcher.get_error()}")
        return Constraint(matcher, self.allocate(1, self.tokenizer.vocab_size))


def read_response_format(value: Any) -> ResponseFormat | None:
    """OpenAI's `response_format`: None for text, else (kind, schema); ValueError naming what is wrong."""
    if value is None or value == {"type": "text"}:
        return None
    kind = value.get("type") if isinstance(value, dict) else None
    if kind == "json_object":
        return ("json_object", None)
    if kind == "json_schema":
        spec = value.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ValueError("response_format json_schema needs json_schema.schema, a JSON Schema object")
        return ("json_schema", schema)
    raise ValueError(f"response_format={value!r}: its type is text, json_object or json_schema")
