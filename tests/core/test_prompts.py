"""One chat template path (`prompts.render_chat`) for training, evaluation and serving: a user turn given as a
string renders as the same chat given as messages, and the text renders to the very tokens transformers' own
tokenizing template gives, so the endpoint's prompt-length count matches what the model is fed."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from dapo_suite.core.prompts import chat_messages, render_chat


def test_render_chat_matches_the_tokenizers_template_for_a_string_and_a_multi_turn_chat(
    embedded_model_dir: Path,
) -> None:
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_dir)
    turn = chat_messages("What is 2 + 3?")
    assert render_chat(tokenizer, turn[0]["content"]) == render_chat(tokenizer, turn)
    chat = [
        {"role": "system", "content": "Be brief."},
        *turn,
        {"role": "assistant", "content": "Answer: 5"},
        {"role": "user", "content": "And 2 + 4?"},
    ]
    text = render_chat(tokenizer, chat)
    assert text.endswith("<|im_start|>assistant\n")
    expected = tokenizer.apply_chat_template(
        chat, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == list(expected)


def test_shots_are_worked_examples_the_reward_grades_right_and_never_a_training_problem():
    from dapo_suite.core.prompts import FORMAT_EXAMPLES, chat_messages
    from dapo_suite.core.reward import compute_score
    from dapo_suite.train.tasks import arithmetic_problems

    chat = chat_messages("What is 2 + 3?", shots=2)
    assert [turn["role"] for turn in chat] == ["user", "assistant", "user", "assistant", "user"]
    assert chat[-1] == chat_messages("What is 2 + 3?")[0]
    curriculum = {problem.problem for problem in arithmetic_problems()}
    for (question, response), turn in zip(FORMAT_EXAMPLES, chat[1::2], strict=False):
        assert turn["content"] == response and question not in curriculum
        assert compute_score("x", response, response.rsplit(" ", 1)[-1])["acc"]
    with pytest.raises(ValueError, match="shots must be between 0 and 2"):
        chat_messages("What is 2 + 3?", shots=3)
