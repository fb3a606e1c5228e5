"""One chat template path (`prompts.render_chat`) for training, evaluation and serving: a user turn given as a
string renders as the same chat given as messages, and the text renders to the very tokens transformers' own
tokenizing template gives, so the endpoint's prompt-length count matches what the model is fed."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from dapo_suite.core.prompts import chat_messages, render_chat


def test_render_chat_matches_the_tokenizers_template_for_a_string_and_a_multi_turn_chat(
        embedded_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    turn = chat_messages("What is 2 + 3?")
    assert render_chat(tokenizer, turn[0]["content"]) == render_chat(tokenizer, turn)
    chat = [{"role": "system", "content": "Be brief."}, *turn, {"role": "assistant", "content": "Answer: 5"},
            {"role": "user", "content": "And 2 + 4?"}]
    text = render_chat(tokenizer, chat)
    assert text.endswith("<|im_start|>assistant\n")
    expected = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == list(expected)
