"""The end-of-run verdict: learned only beyond the noise of the held-out estimate, else the measured
reason."""

from dapo_suite.train.verdict import learning_verdict


def step(kept: int, acc: float = 0.02, fmt: float = 0.05) -> dict:
    return {"sampling/groups_kept": kept, "reward/acc": acc, "reward/format_rate": fmt}


def test_a_rise_beyond_twice_its_standard_error_is_learned():
    verdict = learning_verdict(
        {"acc": 0.2, "acc_stderr": 0.05}, {"acc": 0.6, "acc_stderr": 0.06}, [step(4)] * 12, train_batch_size=4
    )
    assert verdict.learned and verdict.text().startswith("verdict: learned: held-out 20.0 % -> 60.0 %")


def test_a_rise_within_the_noise_is_not_learned_and_names_the_steps_without_mixed_groups():
    steps = [step(0)] * 9 + [step(1), step(4), step(4)]
    verdict = learning_verdict({"acc": 0.024, "acc_stderr": 0.02}, {"acc": 0.0, "acc_stderr": 0.0}, steps, 4)
    assert not verdict.learned
    assert "no mixed group in 9 of 12 steps, fewer than 4 in 1 more" in verdict.reason
    assert "max_num_gen_batches" in verdict.advice and "prompt_shots" in verdict.advice


def test_a_format_rate_that_collapses_is_named():
    steps = [step(4, fmt=0.06)] + [step(4, fmt=0.01)] * 11
    verdict = learning_verdict({"acc": 0.05, "acc_stderr": 0.03}, {"acc": 0.05, "acc_stderr": 0.03}, steps, 4)
    assert not verdict.learned and "format rate fell from 6.0 % to 1.0 %" in verdict.reason
