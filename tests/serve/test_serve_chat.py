"""The chat's pure parts: splitting a reply, the benchmark check, history rebuilding, speed figures, config
checks."""

from __future__ import annotations

import pytest

from dapo_suite.core.problems import Problem
from serve.app import history_to_messages, render
from serve.chat import Speed, check, find_problem, load_examples, split_reply
from serve.config import ServeConfig

AIME_1 = Problem("2024-I-1", "Every morning Aya goes for a walk.\nFind the minutes.", "204")


def test_split_reply_takes_the_answer_line_the_reward_reads():
    reply = split_reply("Walk: 9 km.\nSo the total is 204 minutes.\nAnswer: 204")
    assert reply.thinking == "Walk: 9 km.\nSo the total is 204 minutes."
    assert (reply.answer, reply.integer) == ("204", 204)


def test_split_reply_mid_line_and_bold_answers():
    assert (
        split_reply("7 + 5 = 12\n\nSo, the answer is: Answer: 12").thinking
        == "7 + 5 = 12\n\nSo, the answer is:"
    )
    assert split_reply("x = 3\n**Answer: 3**").integer == 3


def test_split_reply_without_answer_keeps_everything_as_thinking():
    reply = split_reply("I think it is 5")
    assert (reply.thinking, reply.answer, reply.integer) == ("I think it is 5", None, None)


def test_split_reply_boxed_answer_stays_in_the_reasoning():
    reply = split_reply(r"so $\boxed{42}$ is it")
    assert reply.thinking == r"so $\boxed{42}$ is it" and reply.integer == 42


def test_split_reply_non_integer_answer_has_no_integer():
    reply = split_reply("Answer: \\frac{1}{2}")
    assert reply.answer == "\\frac{1}{2}" and reply.integer is None


def test_find_problem_ignores_whitespace_and_check_grades_like_the_reward():
    assert find_problem("  Every morning Aya goes for a walk. Find the minutes. ", [AIME_1]) is AIME_1
    assert find_problem("Every morning Aya goes for a run.", [AIME_1]) is None
    assert check("...\nAnswer: 204", AIME_1) and check("Answer: $204$", AIME_1)
    assert not check("Answer: 205", AIME_1) and not check("204", AIME_1)


def test_load_examples_reads_aime24_package_data():
    problems = load_examples("aime24")
    if not problems:
        pytest.skip("dapo_suite/core/benchmarks/aime24.jsonl is not installed yet")
    assert len(problems) == 30 and all(p.answer.isdigit() for p in problems)
    assert load_examples("no-such-benchmark") == []


def test_speed_counts_generation_after_the_first_token():
    speed = Speed(tokens=11, elapsed_s=3.0, first_token_s=1.0)
    assert speed.tokens_per_s == pytest.approx(5.0)
    assert "11 tokens" in str(speed) and "5.0 tokens/s" in str(speed) and "first token 1.00 s" in str(speed)
    assert Speed(0, 1.0, None).tokens_per_s == 0.0


def test_render_badges_and_round_trip_through_history():
    done = render("9 km at s km/h.\nAnswer: 204", Speed(20, 2.0, 0.5), True, AIME_1)
    thinking, answer = done
    assert thinking.metadata["title"] == "Thinking" and thinking.metadata["status"] == "done"
    assert answer.content.startswith("**Answer:** 204")
    assert (
        "badge-integer" in answer.content
        and "badge-correct" in answer.content
        and "tokens/s" in answer.content
    )
    wrong = render("Answer: 7", Speed(3, 1.0, 0.5), True, AIME_1)[1]
    assert "badge-wrong" in wrong.content and "204" in wrong.content
    history = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": thinking.content, "metadata": thinking.metadata},
        {"role": "assistant", "content": [{"type": "text", "text": answer.content}], "metadata": {}},
    ]
    assert history_to_messages(history, dapo_prompt=False) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "9 km at s km/h.\n\nAnswer: 204"},
    ]
    assert "Answer: $Answer" in history_to_messages(history, dapo_prompt=True)[0]["content"]


def test_render_pending_reply_shows_only_thinking_until_an_answer_appears():
    assert len(render("Let me think", Speed(3, 1.0, 0.5), False, None)) == 1
    assert render("Let me think", Speed(3, 1.0, 0.5), False, None)[0].metadata["status"] == "pending"
    assert len(render("Let me think\nAnswer: 5", Speed(5, 1.0, 0.5), False, None)) == 2


@pytest.mark.parametrize(
    "field, value, hint",
    [
        ("temperature", 3.0, "[0, 2]"),
        ("top_p", 0.0, "(0, 1]"),
        ("max_tokens", 0, "max_tokens"),
        ("engine", "tgi", "choose one of"),
        ("endpoint", "localhost:8000", "http://"),
        ("concurrency_limit", 0, "positive"),
    ],
)
def test_config_rejects_impossible_values_and_says_what_to_set(field, value, hint):
    with pytest.raises(ValueError, match=hint.replace("[", r"\[").replace("(", r"\(")):
        ServeConfig(**{field: value})


def test_config_defaults_are_daposs_evaluation_settings_on_loopback():
    config = ServeConfig()
    assert (config.temperature, config.top_p, config.host, config.dapo_prompt) == (
        1.0,
        0.7,
        "127.0.0.1",
        True,
    )
